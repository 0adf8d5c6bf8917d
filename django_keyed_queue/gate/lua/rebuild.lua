--[[
  Restore a key lost with Redis from the records: its unfinished tickets, in
  ticket order, parked (staged beforehand by stage_rebuild.lua, in chunks); then
  the first `limit` of them granted. The staging becomes the key's queue and
  messages by RENAME, whose work does not grow with the key's depth. Refused when
  anything of the key exists (it is live: rebuilding would corrupt it); the
  staging is then dropped.

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] staged queue      KEYS[6] staged messages
  KEYS[7] wires     HASH ticket -> its message's broker template (a rebuilt key has none)
  ARGV[1] last_ticket: last ticket ever taken for the key (new tickets continue after it)
  ARGV[2] limit: slots per key
  ARGV[3] dispatch_timeout_ms

  Returns {code, ticket1, dispatch1, message1, pushed1, ...}
    code 0 OK      restored; the listed tickets are granted and must be published
    code 8 EXISTS  the key has state in Redis; nothing changed
]]
--- @include "common"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if redis.call('EXISTS', meta_key, queue_key, messages_key, holders_key) > 0 then
  redis.call('UNLINK', KEYS[5], KEYS[6])
  return {8}
end
local limit = tonumber(ARGV[2])
local now = now_ms()
-- Tokens handed out before the loss are unknown: a new epoch starts above them all.
redis.call('HSET', meta_key, 'seq', ARGV[1], 'fence', epoch_base(), 'limit', limit)
if redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('RENAME', KEYS[5], queue_key)
  redis.call('RENAME', KEYS[6], messages_key)
  redis.call('PERSIST', queue_key)
  redis.call('PERSIST', messages_key)
end
return grant_waiting(meta_key, queue_key, messages_key, holders_key, KEYS[7], limit, now + tonumber(ARGV[3]), {0})
