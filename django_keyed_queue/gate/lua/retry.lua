--[[
  A running ticket retries: it keeps its slot through the countdown, and only
  the retry's message (the next dispatch generation) may start it again.
  (A message requeued to the broker, which starts it again as it is: requeue.lua.)

  KEYS[1] messages  KEYS[2] holders
  KEYS[3] wires     HASH ticket -> its message's broker template: the retry's message has none
  ARGV[1] ticket
  ARGV[2] token: fencing token of the running attempt
  ARGV[3] countdown_ms: countdown
  ARGV[4] dispatch_timeout_ms
  ARGV[5] message: message of the retry (replaces the stored one; '' keeps it)

  Returns {code, dispatch}
    code 0 OK           the retry message must carry `dispatch`
    code 5 STALE_TOKEN  the caller no longer holds the ticket; nothing changed
]]
--- @include "common"

local messages_key, holders_key = KEYS[1], KEYS[2]
local ticket = ARGV[1]
local token = tonumber(ARGV[2])
local countdown = tonumber(ARGV[3])
local dispatch_timeout = tonumber(ARGV[4])
local message = ARGV[5]

local holder = running_holder(holders_key, ticket)
if not holder or holder.token ~= token then
  return {5, 0}
end

holder.state = 'g'
holder.dispatch = holder.dispatch + 1
holder.token = 0
holder.deadline = now_ms() + countdown + dispatch_timeout
redis.call('HSET', holders_key, ticket, encode_holder(holder))
if message ~= '' then
  redis.call('HSET', messages_key, ticket, message)
  redis.call('HDEL', KEYS[3], ticket)
end
return {0, holder.dispatch}
