--[[
  Take the next ticket of a key and store its task message.
  The ticket is granted at once when nothing waits before it and the key has
  a free slot; with ARGV[4] > 0 it is also started (a delayed task joining
  its queue on the worker that holds it).

  The key's limit is kept in meta for the reaper, which does not know the task.

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] joined    ZSET of join ids (task ids of delayed tasks that joined), scored by time
  KEYS[6] recent    HASH task id -> ticket of this generation's submissions
  KEYS[7] older     the previous generation (see ARGV[11])
  KEYS[8] unwritten HASH ticket -> submission record, until its row is written
  KEYS[9] wires     HASH ticket -> its message's broker template (see common.lua's push_granted)
  ARGV[1] message: the task message (opaque bytes)
  ARGV[2] limit: slots per key
  ARGV[3] dispatch_timeout_ms
  ARGV[4] lease_ms: lease (0 = grant only, do not start)
  ARGV[5] join_id: join id ('' = none): a second submit with the same id within the horizon is refused
  ARGV[6] idle_horizon_ms
  ARGV[7] max_lost: lost leases to re-dispatch before failing the ticket (used when started at once)
  ARGV[8] retried: '1' = a retry after a lost reply: if the ticket this task id took still holds
          exactly this message, return it as it stands instead of taking another ('' = no)
  ARGV[9] task_id: task id, remembered for ARGV[8] ('' = not remembered)
  ARGV[10] max_waiting: most tickets that may wait in the queue (0 = no limit); a submit that would
          wait behind that many is refused
  ARGV[11] generation_ms: generation length, ms: a task id is remembered for one to two generations
  ARGV[12] record: the submission's record (opaque bytes; '' = none), kept with the ticket as
          "<d (granted) or w (waiting)>|<server ms>|<record>" until its row is written
          (read back by unwritten.lua, parsed by gate/unwritten.py)
  ARGV[13] block: 1 = the task blocks its key when it fails for good (used when started at once)
  ARGV[14] wire: the message's broker template ('' = none): kept with the ticket, and pushed to
          the broker when it is granted (not when started at once: its caller runs it)
  ARGV[15] coalesce: the task's name if it coalesces ('' = it does not): a ticket that must wait
          replaces the one of the same task already waiting (see "Coalescing" below)
  ARGV[16] debounce_ms: > 0 for a debounced task (it coalesces too): its message carries an eta
          that far ahead, and a granted ticket of the task not started yet is replaced as well

  Returns {code, ticket, token, deadline_ms, pushed, superseded ticket, superseded task id}
    code 0 OK          granted (token > 0 when started, deadline = lease end); pushed 1 = its
                       message is on the broker's queue, 0 or a refusal (common.lua's push_reply)
                       = the caller publishes it
    code 1 PARKED      waiting in the queue
    a superseded ticket > 0: this one replaced it (coalescing), and it will never run
    code 7 DUPLICATE   the join id was seen before; nothing changed
    code 10 QUEUE_FULL {10, tickets waiting}; nothing changed
]]
--- @include "common"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local message = ARGV[1]
local limit = tonumber(ARGV[2])  -- kept in meta for the reaper; an operator's override decides
local dispatch_timeout = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local join_id = ARGV[5]
local horizon = tonumber(ARGV[6])
local max_lost = tonumber(ARGV[7])
local now = now_ms()

local task_id = ARGV[9]
local recent_key, older_key = KEYS[6], KEYS[7]

if ARGV[8] == '1' then
  local ticket = redis.call('HGET', recent_key, task_id) or redis.call('HGET', older_key, task_id)
  if ticket and redis.call('HGET', messages_key, ticket) == message then
    local raw = redis.call('HGET', holders_key, ticket)
    if not raw then
      return {1, tonumber(ticket), 0, 0, 0}
    end
    -- Granted: by the lost call, or since by a finish that published it; then the caller
    -- publishes it again and the start check drops the second message.
    local holder = decode_holder(raw)
    return {0, tonumber(ticket), holder.token, holder.deadline, 0}
  end
end

-- Coalescing: meta's "coalesce:<task>" names the task's last submitted ticket. If it still waits
-- (parked: its message is stored, it holds no slot, it is in the queue) or, debounced, it is
-- granted and never started (its message waits out its eta in the broker or a worker; a retry
-- or a recovery of a run that started is not replaced) and nothing waits behind it, and its
-- stored message says it is that task's, this ticket takes its place: it leaves the queue or its
-- slot, its message goes (a copy still on its way is refused at its start), and its record is kept
-- as superseded (state "s") for the writer. A message not as submit stores it is left alone.
local coalesce = ARGV[15] or ''
local debounce = tonumber(ARGV[16]) or 0
local replaced, replaced_id, replaced_granted
if coalesce ~= '' then
  local last = redis.call('HGET', meta_key, 'coalesce:' .. coalesce)
  local raw = last and redis.call('HGET', holders_key, last)
  local holder = raw and decode_holder(raw) or nil  -- HGET gives false for a missing field
  local stored = last and redis.call('HGET', messages_key, last)
  local unstarted = holder and holder.state == 'g' and holder.attempts == 0
    and redis.call('LLEN', queue_key) == 0  -- else its freed slot would be the queue head's, ungranted
  if stored and (not holder or (debounce > 0 and unstarted)) then
    local ok, envelope = pcall(cjson.decode, stored)
    if ok and type(envelope) == 'table' and envelope.task == coalesce and type(envelope.id) == 'string'
      and (holder or redis.call('LPOS', queue_key, last, 'RANK', -1)) then
      replaced, replaced_id, replaced_granted = last, envelope.id, holder ~= nil
    end
  end
end

local free = redis.call('LLEN', queue_key) == 0
  and redis.call('HLEN', holders_key) - (replaced_granted and 1 or 0) < effective_limit(meta_key, limit)
  and not grants_held(meta_key)

local max_waiting = tonumber(ARGV[10])
if not free and max_waiting > 0 then
  local waiting = redis.call('LLEN', queue_key)
  if waiting - ((replaced and not replaced_granted) and 1 or 0) >= max_waiting then
    return {10, waiting, 0, 0, 0}
  end
end

if join_id ~= '' then
  local joined_key = KEYS[5]
  redis.call('ZREMRANGEBYSCORE', joined_key, '-inf', now - horizon)
  if redis.call('ZSCORE', joined_key, join_id) then
    return {7, 0, 0, 0, 0}
  end
  redis.call('ZADD', joined_key, now, join_id)
  redis.call('PEXPIRE', joined_key, horizon)
end

local ticket = redis.call('HINCRBY', meta_key, 'seq', 1)
redis.call('HSET', meta_key, 'limit', limit)
redis.call('PERSIST', meta_key)
redis.call('HSET', messages_key, ticket, message)
if ARGV[14] ~= '' then
  redis.call('HSET', KEYS[9], ticket, ARGV[14])
end

if task_id ~= '' then
  -- Two generations of task ids, each expiring on its own: memory follows the key's recent
  -- submissions, not its queue, and nothing else has to forget them.
  local generation = tonumber(ARGV[11])
  if now - tonumber(redis.call('HGET', meta_key, 'recent_since') or '0') >= generation then
    if redis.call('EXISTS', recent_key) == 1 then
      redis.call('RENAME', recent_key, older_key)
    end
    redis.call('HSET', meta_key, 'recent_since', now, 'generation', generation)
    redis.call('HSET', recent_key, task_id, ticket)
    redis.call('PEXPIRE', recent_key, 2 * generation)
  else
    redis.call('HSET', recent_key, task_id, ticket)
  end
end

if ARGV[12] ~= '' then
  redis.call('HSET', KEYS[8], ticket, (free and 'd|' or 'w|') .. now .. '|' .. ARGV[12])
end

if replaced then
  if replaced_granted then
    redis.call('HDEL', holders_key, replaced)
  else
    redis.call('LREM', queue_key, -1, replaced)
  end
  drop_message(messages_key, KEYS[9], replaced)
  supersede_record(KEYS[8], replaced, replaced_id, coalesce, task_id, now)
else
  replaced, replaced_id = 0, ''
end
if coalesce ~= '' then
  redis.call('HSET', meta_key, 'coalesce:' .. coalesce, ticket)
end

if not free then
  redis.call('RPUSH', queue_key, ticket)
  return {1, ticket, 0, 0, 0, tonumber(replaced), replaced_id}
end

if lease > 0 then
  local token = next_token(meta_key)
  redis.call('HSET', holders_key, ticket, encode_holder(new_holder('r', token, now + lease, 1, max_lost, tonumber(ARGV[13]) or 0)))
  return {0, ticket, token, now + lease, 0, tonumber(replaced), replaced_id}
end
-- A debounced grant's message waits out its eta first: its dispatch deadline runs from then.
local deadline = now + debounce + dispatch_timeout
redis.call('HSET', holders_key, ticket, encode_holder(new_holder('g', 0, deadline, 0, 0, 0)))
local pushed = push_reply(KEYS[9], ticket, 1)
return {0, ticket, 0, deadline, pushed, tonumber(replaced), replaced_id}
