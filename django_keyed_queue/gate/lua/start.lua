--[[
  A worker is about to run a ticket: check that this message may start it,
  then start its lease on the server's clock and hand out a fencing token.

  KEYS[1] meta      KEYS[2] holders      KEYS[3] messages
  KEYS[4] pool's running   KEYS[5] pool's ready   KEYS[6] pool's meta   (includes/pool.lua; only with ARGV[8])
  ARGV[1] ticket
  ARGV[2] dispatch: dispatch generation carried by the message
  ARGV[3] lease_ms: lease
  ARGV[4] max_lost: lost leases to re-dispatch before failing the ticket (the task's policy)
  ARGV[5] task_id: task id of the message ('' = not checked): it must be the id of the
          message stored with the ticket, so a message that copied another's
          header cannot take its ticket
  ARGV[6] block: 1 = the task blocks its key when it fails for good (its policy), else 0
  ARGV[7] interval_ms: least ms between two starts of the key (the task's rate; 0 = none): a start
          sooner than that after the key's last one is refused, and the holder's dispatch
          deadline moved past the time it may start, so the reaper publishes it again if
          the message that waits for that time is lost
  ARGV[8] pool: the pool whose slot the ticket also needs, asked here, on the keys' own server ('' = none,
          or asked apart; see includes/pool_here.lua): a ticket its pool has no slot for waits for its pool
          (pool_wait.lua), and one its pool's rate does not let start yet is TOO_EARLY
  ARGV[9] pool_member: its member in the pool, "<ticket>|<key>"
  ARGV[10] pool_limit: the pool's limit as the task gives it (0 = none)
  ARGV[11] pool_interval_ms: least ms between two starts of the pool's tasks (0 = none)
  ARGV[12] pool_hold_ms: how long the slot is held from now without a renew (the lease and a margin)
  ARGV[13] dispatch_timeout_ms: how long a slot the pool gives another ticket is held for its start

  Returns {code, token, attempts, lease_deadline_ms, '', pool grants}, or {12, 0, attempts, wait_ms, message,
  pool grants}; pool grants: {key, ticket, dispatch, message, pushed, ...} of the tickets a slot the pool
  freed here went to (publish those not pushed)
    code 0 OK               started
    code 1 PARKED           it waits for its pool: no slot free (its message is dropped)
    code 2 NOT_GRANTED      the ticket holds no slot (finished, cancelled or still parked), or it
                            failed and blocks its key, or it waits for its pool (pool_wait.lua)
    code 3 ALREADY_STARTED  a message of this ticket already started it
    code 4 STALE_DISPATCH   the message is from an older dispatch (superseded by a retry)
    code 9 FOREIGN_MESSAGE  the message is not the ticket's own (another task id)
    code 12 TOO_EARLY       not yet: the key's last start was less than ARGV[7] ms ago, or its pool's
                            rate does not let it start; it may start in wait_ms (its stored message
                            is returned, to send for then)
]]
--- @include "common"
--- @include "pool"
--- @include "pool_here"

local meta_key, holders_key, messages_key = KEYS[1], KEYS[2], KEYS[3]
local ticket = ARGV[1]
local dispatch = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local max_lost = tonumber(ARGV[4])
local task_id = ARGV[5]
local block = tonumber(ARGV[6]) or 0
local interval = effective_interval(meta_key, tonumber(ARGV[7]) or 0)

local raw = redis.call('HGET', holders_key, ticket)
if not raw then
  return {2, 0, 0, 0}
end
local holder = decode_holder(raw)
if holder.state == 'b' or holder.state == 'w' then
  return {2, 0, holder.attempts, 0}
end
if task_id ~= '' then
  local _, id = message_names(redis.call('HGET', messages_key, ticket))
  if id ~= task_id then
    return {9, 0, holder.attempts, 0}
  end
end
if holder.dispatch ~= dispatch then
  return {4, 0, holder.attempts, 0}
end
if holder.state == 'r' then
  return {3, 0, holder.attempts, 0}
end

local now = now_ms()
local pool_grants = {}
local pool = ARGV[8] or ''
if pool ~= '' then
  local running_key, ready_key, pool_meta = KEYS[4], KEYS[5], KEYS[6]
  local timeout = tonumber(ARGV[13])
  local limit, pool_interval = pool_settings(pool_meta, tonumber(ARGV[10]), tonumber(ARGV[11]))
  local code, wait, others = pool_take(
    running_key, ready_key, pool_meta, ARGV[9], limit, pool_interval, tonumber(ARGV[12]), true, timeout, now)
  grant_members(others, running_key, ready_key, pool_meta, timeout, timeout, now, pool_grants)
  if code == 1 then
    wait_for_pool(meta_key, holders_key, ticket, dispatch, pool, timeout, now)
    return {1, 0, holder.attempts, 0, '', pool_grants}
  elseif code == 12 then
    -- Its dispatch deadline moves past then, as a key's rate moves it (rate_wait).
    holder.deadline = now + wait + lease
    redis.call('HSET', holders_key, ticket, encode_holder(holder))
    return {12, 0, holder.attempts, wait, redis.call('HGET', messages_key, ticket), pool_grants}
  end
end
if interval > 0 then
  local wait = rate_wait(meta_key, holders_key, ticket, holder, interval, lease, now)
  if wait > 0 then
    return {12, 0, holder.attempts, wait, redis.call('HGET', messages_key, ticket), pool_grants}
  end
  redis.call('HSET', meta_key, 'last_start', now, 'interval', interval)
end
local deadline = now + lease
holder.state = 'r'
holder.token = next_token(meta_key)
holder.deadline = deadline
holder.attempts = holder.attempts + 1
holder.max_lost = max_lost
holder.block = block
redis.call('HSET', holders_key, ticket, encode_holder(holder))
return {0, holder.token, holder.attempts, deadline, '', pool_grants}
