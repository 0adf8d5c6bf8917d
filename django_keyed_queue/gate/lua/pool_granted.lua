--[[
  A ticket's pool gave it a slot (pool_acquire or pool_release returned its member): it is
  granted again with its next dispatch, and its message pushed to the broker if it can be (an
  earlier dispatch's message, still on its way, is refused at its start). A repeat is harmless:
  a granted ticket is published once more, with one more dispatch.

  KEYS[1] meta      KEYS[2] holders      KEYS[3] messages      KEYS[4] wires
  ARGV[1] ticket
  ARGV[2] dispatch_timeout_ms

  Returns {code, dispatch, message, pushed}
    code 0 OK            granted: publish the message with this dispatch unless pushed is 1
                         (common.lua's push_reply)
    code 2 NOT_GRANTED   the ticket holds no slot (finished, cancelled) or blocks its key: its
                         pool slot must be given back
    code 6 RUNNING       it runs already: its pool slot is its run's
]]
--- @include "common"

local meta_key, holders_key, messages_key, ticket = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local raw = redis.call('HGET', holders_key, ticket)
local holder = raw and decode_holder(raw)
if holder and holder.state == 'r' then
  return {6, 0, '', 0}
end
if not holder or holder.state == 'b' then
  return {2, 0, '', 0}
end
holder.state = 'g'
holder.dispatch = holder.dispatch + 1
holder.deadline = now_ms() + tonumber(ARGV[2])
redis.call('HSET', holders_key, ticket, encode_holder(holder))
redis.call('HDEL', meta_key, 'pool:' .. ticket)
local pushed = push_reply(KEYS[4], ticket, holder.dispatch)
return {0, holder.dispatch, redis.call('HGET', messages_key, ticket) or '', pushed}
