--[[
  A running ticket's message goes back to the broker (Reject(requeue=True)):
  the ticket keeps its slot, granted again with the same dispatch generation
  and the same stored message, so that the broker's next delivery of that
  message may start it again. If that delivery never comes, the reaper
  publishes the stored message again after the dispatch timeout.

  KEYS[1] holders
  ARGV[1] ticket
  ARGV[2] token: fencing token of the running attempt
  ARGV[3] dispatch_timeout_ms
  ARGV[4] unstarted: '1' = the attempt never ran (a grant its finish started for a worker's local
          handoff that goes by broker after all): its attempt is not counted

  Returns {code}
    code 0 OK           granted again, same dispatch
    code 5 STALE_TOKEN  the caller no longer holds the ticket; nothing changed
]]
--- @include "common"

local holders_key = KEYS[1]
local ticket = ARGV[1]
local token = tonumber(ARGV[2])
local dispatch_timeout = tonumber(ARGV[3])

local holder = running_holder(holders_key, ticket)
if not holder or holder.token ~= token then
  return {5}
end

holder.state = 'g'
holder.token = 0
holder.deadline = now_ms() + dispatch_timeout
if ARGV[4] == '1' then
  holder.attempts = holder.attempts - 1
end
redis.call('HSET', holders_key, ticket, encode_holder(holder))
return {0}
