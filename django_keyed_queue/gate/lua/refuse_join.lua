--[[
  Refuse the later join of a delayed task (one sent with a countdown or eta,
  which takes its ticket on the worker when due): its join id is marked seen,
  so its submit with that id will be a duplicate and change nothing.

  KEYS[1] joined    ZSET of join ids, scored by time (see submit)
  ARGV[1] join_id: the task id
  ARGV[2] due_in_ms: how soon the task is due (0 = now): the mark is kept until then
          plus the idle horizon
  ARGV[3] idle_horizon_ms

  Returns {code}
    code 0 OK      refused: the task will not join
    code 8 EXISTS  it joined already (it has a ticket); nothing changed
]]
--- @include "common"

local joined_key, join_id = KEYS[1], ARGV[1]
local horizon = tonumber(ARGV[3])
local now = now_ms()
local due = now + math.max(tonumber(ARGV[2]), 0)

if redis.call('ZADD', joined_key, 'NX', due, join_id) == 0 then
  return {8}
end
local keep = due - now + horizon
if redis.call('PTTL', joined_key) < keep then
  redis.call('PEXPIRE', joined_key, keep)
end
return {0}
