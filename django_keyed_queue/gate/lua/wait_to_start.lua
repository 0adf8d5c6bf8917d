--[[
  Before a worker hands a granted ticket's message to a process: how long its
  key's rate makes it wait (start.lua, given the same rate, decides at the start
  itself). A wait moves the holder's dispatch deadline as start.lua does.

  KEYS[1] meta      KEYS[2] holders      KEYS[3] messages
  ARGV[1] ticket
  ARGV[2] dispatch: dispatch generation carried by the message
  ARGV[3] interval_ms: least ms between two starts of the key (the task's rate)
  ARGV[4] lease_ms: lease

  Returns {wait_ms, message}: wait_ms 0 (and no message) when it may start now, or
  when the message may not start the ticket at all (the start says why)
]]
--- @include "common"

local meta_key, holders_key = KEYS[1], KEYS[2]
local ticket = ARGV[1]
local raw = redis.call('HGET', holders_key, ticket)
local holder = raw and decode_holder(raw)
local wait = 0
if holder and holder.state == 'g' and holder.dispatch == tonumber(ARGV[2]) then
  local interval = effective_interval(meta_key, tonumber(ARGV[3]))
  wait = rate_wait(meta_key, holders_key, ticket, holder, interval, tonumber(ARGV[4]), now_ms())
end
if wait > 0 then
  return {wait, redis.call('HGET', KEYS[3], ticket)}
end
return {wait}
