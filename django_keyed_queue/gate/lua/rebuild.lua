--[[
  Restore a key lost with Redis from the records: its unfinished tickets, in
  ticket order, parked; then the first `limit` of them granted. Refused when
  anything of the key exists (it is live: rebuilding would corrupt it).

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  ARGV[1] last ticket ever taken for the key (new tickets continue after it)
  ARGV[2] limit (slots per key)
  ARGV[3] dispatch timeout, ms
  ARGV[4], ARGV[5], ...  ticket, message, repeated, oldest first

  Returns {code, ticket1, dispatch1, message1, ...}
    code 0 OK      restored; the listed tickets are granted and must be published
    code 8 EXISTS  the key has state in Redis; nothing changed
]]
--- @include "common"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if redis.call('EXISTS', meta_key, queue_key, messages_key, holders_key) > 0 then
  return {8}
end
local limit = tonumber(ARGV[2])
local now = now_ms()
-- Tokens handed out before the loss are unknown: a new epoch starts above them all.
redis.call('HSET', meta_key, 'seq', ARGV[1], 'fence', epoch_base(), 'limit', limit)
for i = 4, #ARGV, 2 do
  redis.call('RPUSH', queue_key, ARGV[i])
  redis.call('HSET', messages_key, ARGV[i], ARGV[i + 1])
end
return grant_waiting(meta_key, queue_key, messages_key, holders_key, limit, now + tonumber(ARGV[3]), {0})
