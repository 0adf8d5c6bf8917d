--[[
  An operator acts on the ticket that blocks its key (it failed for good, and
  its task blocks its key on failure): run it again at the head of the key's
  queue, or withdraw it so that the key moves on.

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] wires     HASH ticket -> its message's broker template (see common.lua's push_granted)
  ARGV[1] ticket
  ARGV[2] retry: 1 = run it again (its stored message, with the next dispatch); 0 = withdraw it
  ARGV[3] dispatch_timeout_ms
  ARGV[4] idle_horizon_ms

  Returns {code, ticket1, dispatch1, message1, pushed1, ...}: the tickets granted (those not
  pushed must be published), the retried one itself, or those granted in the withdrawn one's place
    code 0 OK           done
    code 2 NOT_GRANTED  the ticket does not block its key; nothing changed
]]
--- @include "common"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ticket = ARGV[1]
local dispatch_timeout = tonumber(ARGV[3])

local raw = redis.call('HGET', holders_key, ticket)
if not raw or decode_holder(raw).state ~= 'b' then
  return {2}
end
reblock(meta_key, holders_key, ticket)
local now = now_ms()
if ARGV[2] == '1' then
  local holder = decode_holder(raw)
  holder.state, holder.token, holder.lost = 'g', 0, 0
  holder.dispatch = holder.dispatch + 1
  holder.deadline = now + dispatch_timeout
  redis.call('HSET', holders_key, ticket, encode_holder(holder))
  local pushed = push_reply(KEYS[5], ticket, holder.dispatch)
  return {0, tonumber(ticket), holder.dispatch, redis.call('HGET', messages_key, ticket), pushed}
end
redis.call('HDEL', holders_key, ticket)
drop_message(messages_key, KEYS[5], ticket)
local limit = tonumber(redis.call('HGET', meta_key, 'limit') or '1')
local out = grant_waiting(meta_key, queue_key, messages_key, holders_key, KEYS[5], limit, now + dispatch_timeout, {0})
expire_if_idle(meta_key, queue_key, holders_key, tonumber(ARGV[4]))
return out
