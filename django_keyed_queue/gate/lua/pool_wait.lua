--[[
  A granted ticket whose pool had no slot for it (pool_acquire said PARKED) waits for its pool:
  it keeps its key's slot, and no message of it may start (start.lua refuses a waiting holder)
  until its pool gives it a slot and pool_granted publishes it again. If its pool's reply was
  lost, the reaper asks its pool again at the deadline set here.

  KEYS[1] meta      KEYS[2] holders
  ARGV[1] ticket
  ARGV[2] dispatch: the dispatch of the message the pool refused (a later one is left alone)
  ARGV[3] pool: the pool's name, kept in meta's "pool:<ticket>" while the ticket waits
  ARGV[4] ask_again_ms: when the reaper asks the pool again, from now

  Returns {code, deadline_ms}
    code 0 OK            it waits for its pool
    code 2 NOT_GRANTED   the ticket holds no slot, or holds it for another dispatch, or runs: nothing changed
]]
--- @include "common"

local code, deadline = wait_for_pool(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), now_ms())
if code == 2 then
  return {2, 0}
end
return {0, deadline}
