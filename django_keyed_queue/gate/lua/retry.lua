--[[
  A running ticket retries: it keeps its slot through the countdown, and only
  the retry's message (the next dispatch generation) may start it again.
  Or it is requeued (ARGV[6]): the broker delivers the same message again, and
  that message (the same dispatch) may start it again.

  KEYS[1] messages  KEYS[2] holders
  ARGV[1] ticket
  ARGV[2] fencing token of the running attempt
  ARGV[3] countdown, ms
  ARGV[4] dispatch timeout, ms
  ARGV[5] message of the retry (replaces the stored one; '' keeps it)
  ARGV[6] '1' = requeued: keep the dispatch generation and the message ('' = a retry)

  Returns {code, dispatch}
    code 0 OK           the retry message must carry `dispatch` (a requeue: the same as before)
    code 5 STALE_TOKEN  the caller no longer holds the ticket; nothing changed
]]
--- @include "common"

local messages_key, holders_key = KEYS[1], KEYS[2]
local ticket = ARGV[1]
local token = tonumber(ARGV[2])
local countdown = tonumber(ARGV[3])
local dispatch_timeout = tonumber(ARGV[4])

local holder = running_holder(holders_key, ticket)
if not holder or holder.token ~= token then
  return {5, 0}
end

local requeued = ARGV[6] == '1'
holder.state = 'g'
if not requeued then
  holder.dispatch = holder.dispatch + 1
end
holder.token = 0
holder.deadline = now_ms() + countdown + dispatch_timeout
redis.call('HSET', holders_key, ticket, encode_holder(holder))
if ARGV[5] ~= '' then
  redis.call('HSET', messages_key, ticket, ARGV[5])
end
return {0, holder.dispatch}
