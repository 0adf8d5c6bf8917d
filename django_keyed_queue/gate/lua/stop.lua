--[[
  Stop a running ticket: an operator stops it, or Celery kills its process on purpose (revoked
  with terminate, hard time limit). Its run is not recovered (its recoveries are spent), and it
  keeps its slot until it has ended: its worker says so (a release of that dispatch), or its
  lease expires. It is not fenced: while its process lives it renews its lease, and its key's
  next task cannot start beside it. The first stop of an attempt is noted in meta
  ("stop:<ticket>"), so that its end, by whichever path, says who stopped it.

  KEYS[1] meta      KEYS[2] holders
  ARGV[1] ticket
  ARGV[2] dispatch: the dispatch generation of the run to stop: only that attempt is stopped
  ARGV[3] by: who stops it ('' = Celery kills it: noted only if nobody stopped it first)
  ARGV[4] how: what was done to its process (e.g. "SIGTERM"), or why Celery killed it

  Returns {code, by, since_ms, how}: who stopped the attempt first, when (server ms), and how
    code 0 OK           stopped, now or before
    code 2 NOT_GRANTED  that attempt does not run (it ended, or was replaced by another dispatch)
]]
--- @include "common"

local meta_key, holders_key = KEYS[1], KEYS[2]
local ticket, dispatch = ARGV[1], tonumber(ARGV[2])

local holder = running_holder(holders_key, ticket)
if not holder or holder.dispatch ~= dispatch then
  return {2, '', 0, ''}
end

local field = 'stop:' .. ticket
local noted = stop_noted(meta_key, ticket, dispatch)
if noted and (noted.by ~= '' or ARGV[3] == '') then
  return {0, noted.by, noted.since, noted.how}
end
forget_marks(meta_key, holders_key, 'stop', ticket)
local since = noted and noted.since or now_ms()
redis.call('HSET', meta_key, field, string.format('%d|%d|%s|%s', dispatch, since, ARGV[4], ARGV[3]))
holder.max_lost = holder.lost
redis.call('HSET', holders_key, ticket, encode_holder(holder))
return {0, ARGV[3], since, ARGV[4]}
