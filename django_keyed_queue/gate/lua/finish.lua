--[[
  A running ticket is done (succeeded, or failed for good): free its slot and
  grant the next parked tickets up to the limit. A ticket that failed for good
  and whose task blocks its key on failure keeps its slot instead: the key is
  blocked (see common.lua) and grants nothing. The run's outcome is kept
  with the key until its record is written (the worker deletes it then; the
  reaper writes it if the worker died first).

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] outcomes  HASH task id -> "<finished ms>|<record of the run's end>"
  KEYS[6] wires     HASH ticket -> its message's broker template (see common.lua's push_granted)
  KEYS[7] unwritten HASH ticket -> submission record, until its row is written (see submit.lua)
  KEYS[8] pool's running   KEYS[9] pool's ready   KEYS[10] pool's meta   (includes/pool.lua; only with ARGV[11])
  ARGV[1] ticket
  ARGV[2] token: fencing token of the finishing attempt
  ARGV[3] limit: slots per key
  ARGV[4] dispatch_timeout_ms
  ARGV[5] idle_horizon_ms
  ARGV[6] task_id: task id of the run ('' = keep no outcome)
  ARGV[7] record: the record of the run's end (opaque)
  ARGV[8] block: '1' = the run failed for good and its task blocks its key on failure: block it
  ARGV[9] kept_ms: > 0 = the caller keeps the first grant to run it itself: it is not pushed, and
          is published again this long from now if it has not started (0 = push every grant)
  ARGV[10] start_kept: 'lease_ms|max_lost|block|task name' = the kept grant is also started here, for
          the caller, if its stored message is of that task (the finishing task's policy is then its
          own): its lease runs, and its token is returned ('' = it is started by its own start call);
          meta's "kept" says "<token of the run ended>|<kept ticket>|<its token>" until the next such start
  ARGV[11] pool: the pool whose slot the run held, given back here, on the keys' own server ('' = none, or
          given back apart; see includes/pool_here.lua): the oldest waiting tickets take the freed slot
  ARGV[12] pool_member: the run's member in the pool, "<ticket>|<key>"
  ARGV[13] pool_hold_ms: how long a kept grant started here (ARGV[10]) holds the slot its pool gives it,
          asked here too, after the freed slot went to the pool's line: no slot, and it is kept unstarted

  Returns {code, token, attempts, record, message, pool grants, ticket1, dispatch1, message1, pushed1, ticket2, ...}
    code 0 OK           finished; the listed tickets are now granted: those not pushed must be published.
                        token > 0: the first, kept, was started too (its attempt number follows)
    code 5 STALE_TOKEN  the caller no longer holds the ticket (fenced); nothing changed
    code 11 BLOCKED     it failed and now blocks its key (its pool slot is given back all the same)
    record: the ticket's submission record as submit keeps it, if its row is not written yet ('' if
    it is), and message, its stored message then (as a writer's pass would write it): the caller
    writes the row once, in its final state, then deletes the record. Kept until then, so that a
    caller killed first loses nothing (a writer's pass writes it).
    pool grants: {key, ticket, dispatch, message, pushed, ...} of the tickets the freed pool slot went to
]]
--- @include "common"
--- @include "pool"
--- @include "pool_here"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ticket = ARGV[1]
local token = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local dispatch_timeout = tonumber(ARGV[4])
local horizon = tonumber(ARGV[5])

local holder = running_holder(holders_key, ticket)
if not holder or holder.token ~= token then
  return {5}
end

local now = now_ms()
local unwritten = redis.call('HGET', KEYS[7], ticket) or ''
local stored = unwritten ~= '' and (redis.call('HGET', messages_key, ticket) or '') or ''
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[5], ARGV[6], now .. '|' .. ARGV[7])
  redis.call('PEXPIRE', KEYS[5], horizon)
end
-- The run's pool slot goes back: a blocked ticket keeps its key, not its pool.
local pool_grants = {}
if (ARGV[11] or '') ~= '' then
  local running_key, ready_key, pool_meta = KEYS[8], KEYS[9], KEYS[10]
  local timeout = tonumber(ARGV[4])
  local granted = pool_give_back(running_key, ready_key, pool_meta, {ARGV[12]}, timeout, now)
  grant_members(granted, running_key, ready_key, pool_meta, timeout, timeout, now, pool_grants)
end
if ARGV[8] == '1' then
  block_ticket(meta_key, holders_key, ticket, holder)
  return {11, 0, 0, unwritten, stored, pool_grants}
end
redis.call('HDEL', holders_key, ticket)
drop_message(messages_key, KEYS[6], ticket)
local kept_ms = tonumber(ARGV[9])
local lease, max_lost, block, task = string.match(ARGV[10], '^(%d+)|(%d+)|([01])|(.+)$')
local out = {0, 0, 0, unwritten, stored, pool_grants}
-- The kept grant's slot of the pool, asked as its own start would (after the line was served): true if it
-- holds one and may start now.
local function pool_slot_for(kept)
  if (ARGV[11] or '') == '' then
    return true
  end
  local running_key, ready_key, pool_meta = KEYS[8], KEYS[9], KEYS[10]
  local timeout = tonumber(ARGV[4])
  local limit, interval = pool_settings(pool_meta, nil, nil)
  local member = kept .. '|' .. string.match(ARGV[12], '^%d+|(.*)$')
  local code, _, others = pool_take(
    running_key, ready_key, pool_meta, member, limit, interval, tonumber(ARGV[13]), true, timeout, now)
  grant_members(others, running_key, ready_key, pool_meta, timeout, timeout, now, pool_grants)
  return code == 0
end
local function keep(kept)
  if lease and effective_interval(meta_key, 0) == 0 then  -- a key paced by an operator: its start decides
    if message_names(redis.call('HGET', messages_key, kept)) == task and pool_slot_for(kept) then
      local holder = new_holder('r', next_token(meta_key), now + tonumber(lease), 1, tonumber(max_lost), tonumber(block))
      out[2], out[3] = holder.token, holder.attempts
      -- For a caller whose reply is lost: which run it ended started which ticket (Gate.kept_by).
      redis.call('HSET', meta_key, 'kept', string.format('%d|%s|%d', token, kept, holder.token))
      return holder
    end
  end
  return new_holder('g', 0, now + kept_ms, 0, 0, 0)
end
grant_waiting(meta_key, queue_key, messages_key, holders_key, KEYS[6], limit,
  now + dispatch_timeout, out, kept_ms > 0 and keep or nil)
expire_if_idle(meta_key, queue_key, holders_key, horizon)
return out
