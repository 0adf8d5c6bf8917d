--[[
  Helpers of the pool scripts (pool_acquire, pool_release, pool_renew). A pool is a limit shared by
  every key and worker; its state lives in its own slot, so a script of the pool never touches a
  key's and the pool runs unchanged on Redis Cluster:
    running  ZSET member -> server ms until which its slot is held (renewed with its run's lease)
    ready    ZSET member -> order of arrival: tickets waiting for a slot, served first come first
    meta     HASH limit, interval (as the tasks give them), limit_override, interval_override (an
             operator's), seq (arrival counter), last_start, reserved (latest start time handed
             out by the rate), "at:<member>" (a member's reserved start)
  A member is "<ticket>|<key>": a ticket is digits, so the first bar splits it.

  A slot is held only while its deadline runs: a run renews it with its lease, so a slot whose
  worker died returns by its lease's end, whoever forgot to release it.
]]

local function pool_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The pool's limit and interval: an operator's override, else what the tasks give (kept in meta
-- for the reaper, which knows no task; nil = as kept). limit 0 = none.
local function pool_settings(meta_key, limit, interval)
  if limit and interval then
    redis.call('HSET', meta_key, 'limit', limit, 'interval', interval)
  end
  local fields = redis.call('HMGET', meta_key, 'limit_override', 'interval_override', 'limit', 'interval')
  return tonumber(fields[1]) or tonumber(fields[3]) or 0, tonumber(fields[2]) or tonumber(fields[4]) or 0
end

local function pool_has_room(running_key, limit)
  return limit == 0 or redis.call('ZCARD', running_key) < limit
end

-- Slots whose deadline passed go back; then the oldest waiting members take the free slots, each
-- held `grant_ms` for its start. Returns the members granted (their keys must be told).
local function pool_refill(running_key, ready_key, meta_key, limit, grant_ms, now)
  local expired = redis.call('ZRANGEBYSCORE', running_key, '-inf', now)
  for _, member in ipairs(expired) do
    redis.call('ZREM', running_key, member)
    redis.call('HDEL', meta_key, 'at:' .. member)
  end
  local granted = {}
  while pool_has_room(running_key, limit) do
    local head = redis.call('ZRANGE', ready_key, 0, 0)[1]
    if not head then
      break
    end
    redis.call('ZREM', ready_key, head)
    redis.call('ZADD', running_key, now + grant_ms, head)
    granted[#granted + 1] = head
  end
  return granted
end

-- Ask for a slot for `member` (pool_acquire.lua says how). Returns code (0 OK, 1 PARKED, 12 TOO_EARLY),
-- the wait (ms, TOO_EARLY), the other members given slots here, whose keys must be told, and whether the
-- slot it holds was given here (it held none before).
local function pool_take(running_key, ready_key, meta_key, member, limit, interval, hold, starting, grant_ms, now)
  local given = not redis.call('ZSCORE', running_key, member)
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
      return 1, 0, others, false
    end
    redis.call('ZADD', running_key, now + hold, member)
  end
  if starting and interval > 0 then
    -- One start per interval, on the server's clock: a member that comes back at the start time it was
    -- given needs only the interval since the last start, and keeps its place in line when the start
    -- before it ran late; any other waits for every start handed out before it too, and is given the next.
    local fields = redis.call('HMGET', meta_key, 'last_start', 'reserved', 'at:' .. member)
    local last, reserved, own = tonumber(fields[1]) or 0, tonumber(fields[2]) or 0, tonumber(fields[3])
    if own and now < own then
      return 12, own - now, others, given  -- asked again before its time (a copy, a second ask): the same time
    end
    local earliest = last + interval
    if not own then
      earliest = math.max(earliest, reserved + interval)
    end
    if now < earliest then
      local due = earliest
      if own then
        redis.call('HSET', meta_key, 'at:' .. member, due)
      else
        redis.call('HSET', meta_key, 'reserved', due, 'at:' .. member, due)
      end
      redis.call('ZADD', running_key, 'GT', due + hold, member)
      return 12, due - now, others, given
    end
    redis.call('HSET', meta_key, 'last_start', now)
    redis.call('HDEL', meta_key, 'at:' .. member)
  end
  if starting then
    redis.call('ZADD', running_key, 'GT', now + hold, member)
  end
  return 0, 0, others, given
end

-- Give back the slots of `members`; the oldest waiting take the free ones. Returns the members granted.
local function pool_give_back(running_key, ready_key, meta_key, members, grant_ms, now)
  for _, member in ipairs(members) do
    redis.call('ZREM', running_key, member)
    redis.call('ZREM', ready_key, member)
    redis.call('HDEL', meta_key, 'at:' .. member)
  end
  return pool_refill(running_key, ready_key, meta_key, pool_settings(meta_key, nil, nil), grant_ms, now)
end
