--[[
  A pooled ticket asks its pool for a slot: at its start (a worker is about to run it), or when
  the reaper asks again for a ticket that waits for its pool. Waiting members are served first
  come first (pool.lua's ready), whatever their key.

  KEYS[1] running   KEYS[2] ready   KEYS[3] meta    (see includes/pool.lua)
  ARGV[1] member: "<ticket>|<key>"
  ARGV[2] limit: most members holding a slot at once (0 = no limit), as the task gives it
          ('' = as the pool keeps it: the reaper's call)
  ARGV[3] interval_ms: least ms between two starts of the pool's tasks (0 = no rate; '' = as kept)
  ARGV[4] hold_ms: how long from now the slot is held without a renew (the run's lease)
  ARGV[5] starting: 1 = a worker starts it now: the rate is checked and the start counted
  ARGV[6] grant_ms: how long a slot given to a waiting member is held for its start

  Returns {code, wait_ms, given, granted member 1, granted member 2, ...}
    code 0 OK          it holds a slot (and, starting, may start now)
    code 1 PARKED      no slot free: it waits in ready (its position follows: wait_ms is unused)
    code 12 TOO_EARLY  it holds a slot, but the pool's rate lets it start only in wait_ms
    given: 1 = the slot it holds was given here (it held none before: it was in the line, or new)
    granted: other waiting members that took slots freed here (an expired one's); their keys must
    publish them (pool_granted)
]]
--- @include "pool"

local now = pool_now_ms()
local limit, interval = pool_settings(KEYS[3], tonumber(ARGV[2]), tonumber(ARGV[3]))
local code, wait, others, given = pool_take(
  KEYS[1], KEYS[2], KEYS[3], ARGV[1], limit, interval, tonumber(ARGV[4]), ARGV[5] == '1', tonumber(ARGV[6]), now)
if code == 1 then
  return {1, 0, 0, unpack(others)}
elseif code == 12 then
  return {12, wait, given and 1 or 0, unpack(others)}
end
return {0, 0, given and 1 or 0, unpack(others)}
