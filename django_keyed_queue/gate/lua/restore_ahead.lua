--[[
  Restore tasks of a key lost with Redis into the key as it is now, which took
  submissions since the loss: the restored tickets go after the key's holders
  and before the tickets waiting in its queue, which are numbered again after
  them, so that the queue stays in ticket order (their messages, broker
  templates, unwritten records, remembered task ids and coalescing marks move
  with them). The restored messages are staged beforehand by stage_rebuild.lua
  (in chunks), under the numbers 1, 2, ... in order; then free slots are granted.
  Its work grows with the key's queue: a rebuild, rare, after a total loss.

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] staged queue      KEYS[6] staged messages
  KEYS[7] wires     KEYS[8] recent     KEYS[9] older (recent's previous generation)
  KEYS[10] unwritten
  ARGV[1] limit: slots per key
  ARGV[2] dispatch_timeout_ms

  Returns {code, first, count, renumbered, old1, new1, ..., ticket1, dispatch1, message1, pushed1, ...}
    code 0 OK         the restored tasks took tickets first .. first + count - 1; renumbered pairs
                      (old ticket, new ticket) of the tickets that waited; then the grants to publish
    code 2 NOT_GRANTED the key has no state (rebuild.lua restores it whole); nothing changed
]]
--- @include "common"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local staged_queue, staged_messages = KEYS[5], KEYS[6]
local wires_key, recent_key, older_key, unwritten_key = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
if redis.call('EXISTS', meta_key, queue_key, messages_key, holders_key) == 0 then
  redis.call('UNLINK', staged_queue, staged_messages)
  return {2}
end
local limit = tonumber(ARGV[1])
local now = now_ms()
local seq = tonumber(redis.call('HGET', meta_key, 'seq')) or 0
local restored = redis.call('LRANGE', staged_queue, 0, -1)
local waiting = redis.call('LRANGE', queue_key, 0, -1)
local first = seq + 1

-- The waiting tickets move after the restored ones; what is kept per ticket moves with them.
local moved, renumbered = {}, {}
for i, ticket in ipairs(waiting) do
  local new_ticket = tostring(seq + #restored + i)
  moved[ticket] = new_ticket
  renumbered[#renumbered + 1] = tonumber(ticket)
  renumbered[#renumbered + 1] = tonumber(new_ticket)
end
-- Every new ticket is above every ticket the key has had (seq): a move never lands on a field not yet moved.
for _, hash in ipairs({messages_key, wires_key, unwritten_key}) do
  for old, new_ticket in pairs(moved) do
    local kept = redis.call('HGET', hash, old)
    if kept then
      redis.call('HDEL', hash, old)
      redis.call('HSET', hash, new_ticket, kept)
    end
  end
end
-- Task ids remembered for a retried submission, and each coalescing task's ticket that waits.
for _, hash in ipairs({recent_key, older_key, meta_key}) do
  local fields = redis.call('HGETALL', hash)
  for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    local new_ticket = moved[value]
    if new_ticket and (hash ~= meta_key or string.sub(name, 1, 9) == 'coalesce:') then
      redis.call('HSET', hash, name, new_ticket)
    end
  end
end

redis.call('DEL', queue_key)
for i, staged in ipairs(restored) do
  local ticket = seq + i
  redis.call('HSET', messages_key, ticket, redis.call('HGET', staged_messages, staged))
  redis.call('RPUSH', queue_key, ticket)
end
for _, ticket in ipairs(waiting) do
  redis.call('RPUSH', queue_key, moved[ticket])
end
redis.call('HSET', meta_key, 'seq', seq + #restored + #waiting)
redis.call('UNLINK', staged_queue, staged_messages)

local out = {0, first, #restored, #waiting}
for _, value in ipairs(renumbered) do
  out[#out + 1] = value
end
local granted = grant_waiting(meta_key, queue_key, messages_key, holders_key, wires_key, limit,
  now + tonumber(ARGV[2]), {0})
for i = 2, #granted do
  out[#out + 1] = granted[i]
end
return out
