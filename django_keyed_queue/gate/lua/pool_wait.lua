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

local meta_key, holders_key, ticket = KEYS[1], KEYS[2], ARGV[1]
local raw = redis.call('HGET', holders_key, ticket)
local holder = raw and decode_holder(raw)
if not holder or holder.state ~= 'g' or holder.dispatch ~= tonumber(ARGV[2]) then
  return {2, 0}
end
holder.state = 'w'
holder.deadline = now_ms() + tonumber(ARGV[4])
redis.call('HSET', holders_key, ticket, encode_holder(holder))
forget_marks(meta_key, holders_key, 'pool', ticket)
redis.call('HSET', meta_key, 'pool:' .. ticket, ARGV[3])
return {0, holder.deadline}
