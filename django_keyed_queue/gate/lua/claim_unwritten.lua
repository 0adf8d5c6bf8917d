--[[
  Claim keys of the unwritten index for one writer: keys scored at most now
  + ahead (when their first record is due to be written, or when a claim
  lapses) are scored now + the claim, so that other writers pass them by until
  it lapses. A submission made meanwhile scores its key lower again, and
  releasing the claim (reindex) then keeps it.

  KEYS[1] the unwritten index (ZSET logical key -> ms when due, or when its claim lapses)
  ARGV[1] claim_ms: how long the claim lasts
  ARGV[2] most_keys: most keys to claim
  ARGV[3] ahead_ms: also keys due this much later (0: only those due; a writer that must show
          every submission now passes the record delay)

  Returns {key1, claim1, key2, claim2, ...}
]]
--- @include "common"

local index_key = KEYS[1]
local now = now_ms()
local claim = now + tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', index_key, '-inf', now + tonumber(ARGV[3]), 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, key in ipairs(due) do
  redis.call('ZADD', index_key, claim, key)
  out[#out + 1] = key
  out[#out + 1] = claim
end
return out
