--[[
  Whether a ticket of a coalescing task waits that is newer than a run's own: the ticket meta
  names as the task's last parked one (submit.lua's "coalesce:<task>"), if it still waits (its
  message is stored and it holds no slot) and came after ARGV[2]. Reads only.

  KEYS[1] meta      KEYS[2] messages      KEYS[3] holders
  ARGV[1] task_name
  ARGV[2] ticket: the run's own

  Returns 1 (a newer one waits) or 0
]]
local last = redis.call('HGET', KEYS[1], 'coalesce:' .. ARGV[1])
local newer = tonumber(last)  -- nil if someone else wrote it
if newer and newer > tonumber(ARGV[2])
  and redis.call('HEXISTS', KEYS[3], last) == 0 and redis.call('HEXISTS', KEYS[2], last) == 1 then
  return 1
end
return 0
