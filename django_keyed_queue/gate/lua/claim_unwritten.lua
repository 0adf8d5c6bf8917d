--[[
  Claim keys of the unwritten index for one writer: keys scored at most now
  (0: records waiting; else a lapsed claim) are scored now + the claim, so
  that other writers pass them by until it lapses. A submission made meanwhile
  scores its key 0 again, and releasing the claim (reindex) then keeps it.

  KEYS[1] the unwritten index (ZSET logical key -> 0, or ms when its claim lapses)
  ARGV[1] claim_ms: how long the claim lasts
  ARGV[2] most_keys: most keys to claim

  Returns {key1, claim1, key2, claim2, ...}
]]
--- @include "common"

local index_key = KEYS[1]
local now = now_ms()
local claim = now + tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', index_key, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, key in ipairs(due) do
  redis.call('ZADD', index_key, claim, key)
  out[#out + 1] = key
  out[#out + 1] = claim
end
return out
