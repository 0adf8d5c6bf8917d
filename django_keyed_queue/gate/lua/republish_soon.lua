--[[
  A granted ticket's message could not be published (the broker refused it), or a
  worker dropped it undelivered (it knows no such task): bring its dispatch deadline
  forward so the reaper publishes it again soon, instead of after the whole
  dispatch timeout.

  KEYS[1] holders
  KEYS[2] undelivered (optional: count the drop, per ticket, in this HASH)
  ARGV[1] ticket
  ARGV[2] dispatch: dispatch generation of the message that failed
  ARGV[3] delay_ms: delay before the reaper publishes it again, ms
  ARGV[4] undelivered_keep_ms: with KEYS[2]: how long the counts are kept, ms (the idle horizon)
  ARGV[5] later: '1' = set the deadline also if it is later (a message published again with an eta
          waits it out first: the reaper must not publish it again meanwhile)

  Returns {code, drops}
    code 0 OK            its deadline is at most the delay away; drops: the ticket's count (0 uncounted)
    code 2 NOT_GRANTED   the ticket is not granted with that dispatch (it started, ended or moved on)
]]
--- @include "common"

local holders_key = KEYS[1]
local ticket = ARGV[1]
local dispatch = tonumber(ARGV[2])
local delay = tonumber(ARGV[3])

local raw = redis.call('HGET', holders_key, ticket)
if not raw then
  return {2}
end
local holder = decode_holder(raw)
if holder.state ~= 'g' or holder.dispatch ~= dispatch then
  return {2}
end
local deadline = now_ms() + delay
if deadline < holder.deadline or ARGV[5] == '1' then
  holder.deadline = deadline
  redis.call('HSET', holders_key, ticket, encode_holder(holder))
end
local drops = 0
if KEYS[2] then
  drops = redis.call('HINCRBY', KEYS[2], ticket, 1)
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return {0, drops}
