--[[
  Give up a running ticket whose process is being killed on purpose (its task
  was revoked with terminate, or hit its hard time limit): fence it now, and
  leave it to the reaper to fail it, without a recovery, once the grace has
  passed. The grace is the time the process has to die, so that the key's
  next task cannot overlap it.

  KEYS[1] meta      KEYS[2] holders
  ARGV[1] ticket
  ARGV[2] grace_ms: grace
  ARGV[3] dispatch: dispatch generation of the killed run: only that attempt is given up

  Returns {code, deadline_ms}
    code 0 OK           fenced; the reaper fails the ticket at deadline_ms
    code 2 NOT_GRANTED  that attempt does not run (it ended, or was replaced by another dispatch)
]]
--- @include "common"

local meta_key, holders_key = KEYS[1], KEYS[2]
local ticket = ARGV[1]
local grace = tonumber(ARGV[2])
local dispatch = tonumber(ARGV[3])

local holder = running_holder(holders_key, ticket)
if not holder or holder.dispatch ~= dispatch then
  return {2, 0}
end

holder.token = next_token(meta_key)
holder.max_lost = holder.lost
holder.deadline = math.min(holder.deadline, now_ms() + grace)
redis.call('HSET', holders_key, ticket, encode_holder(holder))
return {0, holder.deadline}
