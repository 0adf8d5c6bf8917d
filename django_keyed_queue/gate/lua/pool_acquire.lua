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

  Returns {code, wait_ms, granted member 1, granted member 2, ...}
    code 0 OK          it holds a slot (and, starting, may start now)
    code 1 PARKED      no slot free: it waits in ready (its position follows: wait_ms is unused)
    code 12 TOO_EARLY  it holds a slot, but the pool's rate lets it start only in wait_ms
    granted: other waiting members that took slots freed here (an expired one's); their keys must
    publish them (pool_granted)
]]
--- @include "pool"

local running_key, ready_key, meta_key = KEYS[1], KEYS[2], KEYS[3]
local member = ARGV[1]
local hold = tonumber(ARGV[4])
local starting = ARGV[5] == '1'
local grant_ms = tonumber(ARGV[6])
local now = pool_now_ms()
local limit, interval = pool_settings(meta_key, tonumber(ARGV[2]), tonumber(ARGV[3]))

local others = {}
for _, other in ipairs(pool_refill(running_key, ready_key, meta_key, limit, grant_ms, now)) do
  if other ~= member then
    others[#others + 1] = other
  end
end

if not redis.call('ZSCORE', running_key, member) then
  if redis.call('ZCARD', ready_key) > 0 or not pool_has_room(running_key, limit) then
    if not redis.call('ZSCORE', ready_key, member) then
      redis.call('ZADD', ready_key, redis.call('HINCRBY', meta_key, 'seq', 1), member)
    end
    return {1, 0, unpack(others)}
  end
  redis.call('ZADD', running_key, now + hold, member)
end

if starting and interval > 0 then
  -- One start per interval, on the server's clock: a member that comes back at the start time
  -- it was given needs only the interval since the last start; any other waits for every start
  -- handed out before it too, and is given the next one.
  local fields = redis.call('HMGET', meta_key, 'last_start', 'reserved', 'at:' .. member)
  local last, reserved, own = tonumber(fields[1]) or 0, tonumber(fields[2]) or 0, tonumber(fields[3])
  local earliest = last + interval
  if not own then
    earliest = math.max(earliest, reserved + interval)
  end
  if now < earliest then
    local due = math.max(earliest, reserved + interval)
    redis.call('HSET', meta_key, 'reserved', due, 'at:' .. member, due)
    redis.call('ZADD', running_key, 'GT', due + hold, member)
    return {12, due - now, unpack(others)}
  end
  redis.call('HSET', meta_key, 'last_start', now)
  redis.call('HDEL', meta_key, 'at:' .. member)
end
if starting then
  redis.call('ZADD', running_key, 'GT', now + hold, member)
end
return {0, 0, unpack(others)}
