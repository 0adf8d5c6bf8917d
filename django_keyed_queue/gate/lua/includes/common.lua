--[[
  Helpers shared by the gate scripts.

  A holder record (one field of the holders hash, one per occupied slot):
    "<state>|<dispatch>|<token>|<deadline_ms>|<attempts>|<lost>|<max_lost>|<block>"
  state     g = granted, its message published but not started; r = running;
            b = blocked: it failed for good and its task blocks its key on failure;
            w = waiting for its pool: no message of it may start (pool_wait.lua)
  dispatch  generation of the message allowed to start it (1, then +1 per retry or recovery)
  token     fencing token of the running attempt (0 while granted)
  deadline  server-clock ms: lease end when running, dispatch timeout when granted, when the
            reaper asks its pool again when waiting for its pool
  attempts  how many times the ticket has started
  lost      how many of its leases expired (its worker died or stalled)
  max_lost  how many lost leases are re-dispatched; the next one fails the ticket
  block     1 = its task's policy on failure is "block" (set when it starts); absent = 0

  encode_holder and decode_holder below are the format's one home in Lua; in Python,
  gate/inspection.py's decode_holder reads it (snapshots read holders without a script).
  Change them together.

  A blocked key has "blocked" = a blocked ticket in meta, and grants nothing
  until an operator retries or cancels every ticket that blocks it (unblock.lua).
]]

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The first fencing token of a key's epoch: an epoch starts when the key has no
-- counter (new, rebuilt, or expired after the idle horizon), and its tokens start
-- above every token of every earlier epoch, from the server clock in steps of a
-- thousand a millisecond. Below 2^53 (exact in Lua's numbers) for centuries.
local function epoch_base()
  return now_ms() * 1000
end

-- The key's next fencing token.
local function next_token(meta_key)
  if redis.call('HEXISTS', meta_key, 'fence') == 0 then
    redis.call('HSET', meta_key, 'fence', epoch_base())
  end
  return redis.call('HINCRBY', meta_key, 'fence', 1)
end

-- The task name and id a stored message names (nil, nil if it names none). The producer writes
-- them first ('{"task":"...","id":"...",'), read here without decoding the whole message, which
-- cost a third of a start; any other form, or text with an escape in it, is decoded whole.
local function message_names(raw)
  local task, id = string.match(raw or '', '^{"task":"([^"\\]*)","id":"([^"\\]*)",')
  if task then
    return task, id
  end
  local ok, stored = pcall(cjson.decode, raw or '')
  if ok and type(stored) == 'table' then
    return stored.task, stored.id
  end
  return nil, nil
end

local function decode_holder(raw)
  local state, dispatch, token, deadline, attempts, lost, max_lost, block =
    string.match(raw, '^(%a)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|?(%d*)$')
  return {
    state = state,
    dispatch = tonumber(dispatch),
    token = tonumber(token),
    deadline = tonumber(deadline),
    attempts = tonumber(attempts),
    lost = tonumber(lost),
    max_lost = tonumber(max_lost),
    block = tonumber(block) or 0,
  }
end

local function encode_holder(h)
  return string.format('%s|%d|%d|%d|%d|%d|%d|%d',
    h.state, h.dispatch, h.token, h.deadline, h.attempts, h.lost, h.max_lost, h.block)
end

-- The holder of a ticket if it is running, else nil (no slot, or granted only).
local function running_holder(holders_key, ticket)
  local raw = redis.call('HGET', holders_key, ticket)
  if not raw then
    return nil
  end
  local holder = decode_holder(raw)
  if holder.state ~= 'r' then
    return nil
  end
  return holder
end

local function new_holder(state, token, deadline, attempts, max_lost, block)
  return {
    state = state, dispatch = 1, token = token, deadline = deadline,
    attempts = attempts, lost = 0, max_lost = max_lost, block = block,
  }
end

-- How many ms before a granted holder of a key whose starts are at least `interval` ms apart
-- may start; if it must wait, its dispatch deadline becomes `lease` ms past then: the message
-- sent for then starts it within ms, and if that message was lost with its worker, the
-- reaper publishes the ticket again then (a late copy is dropped by the start check). A dispatch an
-- operator ran now does not wait.
local function rate_wait(meta_key, holders_key, ticket, holder, interval, lease, now)
  if redis.call('HGET', meta_key, 'now:' .. ticket) == tostring(holder.dispatch) then
    return 0  -- an operator's Run now of this dispatch (run_now.lua)
  end
  local last = tonumber(redis.call('HGET', meta_key, 'last_start') or '0')
  local wait = math.max(0, last + interval - now)
  if wait > 0 then
    holder.deadline = now + wait + lease
    redis.call('HSET', holders_key, ticket, encode_holder(holder))
  end
  return wait
end

-- An operator's limit and rate for the key (meta's "limit_override" and "interval_override", see
-- override.lua), over what its tasks give.
local function effective_limit(meta_key, limit)
  return tonumber(redis.call('HGET', meta_key, 'limit_override')) or limit
end

local function effective_interval(meta_key, interval)
  return tonumber(redis.call('HGET', meta_key, 'interval_override')) or interval
end

-- An operator's marks in meta ("<prefix>:<ticket>": stop.lua's, run_now.lua's) of tickets that no longer
-- hold a slot go, but `ticket`'s: meta keeps only those that may still be read.
local function forget_marks(meta_key, holders_key, prefix, ticket)
  for _, name in ipairs(redis.call('HKEYS', meta_key)) do
    local other = string.match(name, '^' .. prefix .. ':(%d+)$')
    if other and other ~= ticket and redis.call('HEXISTS', holders_key, other) == 0 then
      redis.call('HDEL', meta_key, name)
    end
  end
end

-- Who stopped the attempt of `ticket` started by `dispatch` (stop.lua), when and how; nil if nobody did.
local function stop_noted(meta_key, ticket, dispatch)
  local raw = redis.call('HGET', meta_key, 'stop:' .. ticket)
  local noted_dispatch, since, how, by = string.match(raw or '', '^(%d+)|(%d+)|([^|]*)|(.*)$')
  if tonumber(noted_dispatch) ~= dispatch then
    return nil
  end
  return {since = tonumber(since), how = how, by = by}
end

-- Whether the key grants nothing now: paused by an operator, or blocked by a failed ticket.
local function grants_held(meta_key)
  return redis.call('HEXISTS', meta_key, 'paused') == 1 or redis.call('HEXISTS', meta_key, 'blocked') == 1
end

-- A ticket that failed for good keeps its slot and its message, and its key grants nothing more.
local function block_ticket(meta_key, holders_key, ticket, holder)
  holder.state, holder.token, holder.deadline = 'b', 0, 0
  redis.call('HSET', holders_key, ticket, encode_holder(holder))
  redis.call('HSET', meta_key, 'blocked', ticket)
end

-- The key's blocked mark once `ticket` no longer blocks it: another of its holders that failed for
-- good and keeps its slot (a key of limit 2 or more may have several), else none.
local function reblock(meta_key, holders_key, ticket)
  local holders = redis.call('HGETALL', holders_key)  -- at most the key's limit
  for i = 1, #holders, 2 do
    if holders[i] ~= ticket and decode_holder(holders[i + 1]).state == 'b' then
      redis.call('HSET', meta_key, 'blocked', holders[i])
      return
    end
  end
  redis.call('HDEL', meta_key, 'blocked')
end

-- The parts of a broker message's template (messaging/wire.py), split at NUL (JSON has none raw).
local function split_template(template)
  local parts, from = {}, 1
  while true do
    local at = string.find(template, '\0', from, true)
    if not at then
      parts[#parts + 1] = string.sub(template, from)
      return parts
    end
    parts[#parts + 1] = string.sub(template, from, at - 1)
    from = at + 1
  end
end

-- Push a granted ticket's message onto Celery's queue as kombu's Redis transport publishes it, when
-- its producer left a template (the gate's Redis is the broker's; see messaging/wire.py):
--   "w1" \0 binding set ('' = the default exchange: the routing key is the queue) \0 routing key
--   \0 key prefix \0 priority suffix \0 the bindings' separator \0 piece \0 hole \0 piece ...
--   (holes: t ticket, d dispatch, g the delivery tag's own part)
-- A direct exchange's queues are looked up in its bindings now, as kombu does when it publishes.
-- The queues' keys are not declared to the script: only a single server gets templates.
-- Returns how many queues it pushed to (0 = no template, or no queue bound: the caller publishes),
-- or, if Redis refused a command (an ACL that does not let the gate's user touch the broker's keys,
-- the broker's memory full), "<command>\0<key>\0<Redis' error>": the caller publishes, and says why.
local function push_granted(wires_key, ticket, dispatch)
  local template = redis.call('HGET', wires_key, ticket)
  if not template then
    return 0
  end
  local parts = split_template(template)
  if parts[1] ~= 'w1' then
    return 0
  end
  local binding, routing_key, prefix, suffix, sep = parts[2], parts[3], parts[4], parts[5], parts[6]
  local queues = {}
  if binding == '' then
    queues[1] = routing_key
  else
    local seen = {}
    local entries = redis.pcall('SMEMBERS', binding)
    if type(entries) ~= 'table' then
      return 0
    end
    if entries.err then
      return 'SMEMBERS\0' .. binding .. '\0' .. entries.err
    end
    for _, entry in ipairs(entries) do
      -- "<routing key><sep><pattern><sep><queue>", as kombu's Redis transport binds a queue.
      local first = string.find(entry, sep, 1, true)
      local second = first and string.find(entry, sep, first + #sep, true)
      local rkey = first and string.sub(entry, 1, first - 1)
      local queue = second and string.sub(entry, second + #sep)
      if queue and rkey == routing_key and not seen[queue] then
        seen[queue] = true
        queues[#queues + 1] = queue
      end
    end
  end
  if #queues == 0 or routing_key == '' and binding == '' then
    return 0
  end
  local t = redis.call('TIME')
  local fill = {
    t = string.format('%d', ticket),
    d = string.format('%d', dispatch),
    g = string.format('%d.%s%06d', dispatch, t[1], tonumber(t[2])),
  }
  local out = {}
  for i = 7, #parts do
    out[#out + 1] = (i % 2 == 1) and parts[i] or fill[parts[i]]
  end
  local payload = table.concat(out)
  for _, queue in ipairs(queues) do
    -- A refused push (an ACL, the broker's memory full) must not fail the grant half-done (Redis
    -- rolls nothing back): it is left to the caller, who publishes the message itself (through
    -- kombu, as the broker's user where that is another) and logs the refusal.
    local pushed = redis.pcall('LPUSH', prefix .. queue .. suffix, payload)
    if type(pushed) == 'table' and pushed.err then
      return 'LPUSH\0' .. prefix .. queue .. '\0' .. pushed.err
    end
  end
  return #queues
end

-- A grant's "pushed" reply field, from push_granted: 1 = its message is on the broker's queue, 0 =
-- the caller publishes it, or the refusal push_granted returned (the caller publishes it, and says
-- why: gate/base.py's pushed).
local function push_reply(wires_key, ticket, dispatch)
  local pushed = push_granted(wires_key, ticket, dispatch)
  if type(pushed) == 'string' then
    return pushed
  end
  return pushed > 0 and 1 or 0
end

-- Grant parked tickets, oldest first, while the key has a free slot and is neither paused nor
-- blocked, each pushed to the broker if it can be (push_granted). Appends ticket, dispatch, message,
-- pushed (push_reply's) for each grant to `out`. `keep`, if given: the caller keeps the first grant
-- to run it itself (a worker's local handoff): it is not pushed, and its holder is `keep(ticket)`'s.
local function grant_waiting(meta_key, queue_key, messages_key, holders_key, wires_key, limit, deadline, out, keep)
  if grants_held(meta_key) then
    return out
  end
  limit = effective_limit(meta_key, limit)
  while redis.call('HLEN', holders_key) < limit do
    local ticket = redis.call('LPOP', queue_key)
    if not ticket then
      break
    end
    local pushed = 0
    if keep then
      redis.call('HSET', holders_key, ticket, encode_holder(keep(ticket)))
      keep = nil
    else
      redis.call('HSET', holders_key, ticket, encode_holder(new_holder('g', 0, deadline, 0, 0, 0)))
      pushed = push_reply(wires_key, ticket, 1)
    end
    out[#out + 1] = tonumber(ticket)
    out[#out + 1] = 1
    out[#out + 1] = redis.call('HGET', messages_key, ticket)
    out[#out + 1] = pushed
  end
  return out
end

-- A ticket's stored message and its broker template are gone.
local function drop_message(messages_key, wires_key, ticket)
  redis.call('HDEL', messages_key, ticket)
  redis.call('HDEL', wires_key, ticket)
end

-- Keep the record of `ticket` (task `task_id`, of task `task_name`), which never ran, as
-- superseded by task `by` at server ms `now`, under the field "<ticket>s" beside the ticket's own:
-- a writer that read the ticket's own record before deletes only that one once its row is written.
-- The value is "s|<now>|<record>": the ticket's record as submit kept it (or, its row written
-- already, the fields that find the row) with "superseded_by" and "enqueued_ms" added, for the
-- writer (records/submissions.py).
local function supersede_record(unwritten_key, ticket, task_id, task_name, by, now)
  local kept = redis.call('HGET', unwritten_key, ticket)
  local enqueued, record = string.match(kept or '', '^%a|(%d+)|(.*)$')
  local ok, data = pcall(cjson.decode, record or '')
  if not (ok and type(data) == 'table') then
    data = {task_id = task_id, task_name = task_name, arguments = ''}
  end
  data.superseded_by = by
  data.enqueued_ms = enqueued
  redis.call('HSET', unwritten_key, ticket .. 's', 's|' .. now .. '|' .. cjson.encode(data))
end

-- One step of an HSCAN of `hash_key` (about `count` fields) that goes on where the last step of
-- `name` stopped, its cursor kept in `cursors_key` for `keep_ms`: the caller deletes what it read,
-- and steps that always began at cursor 0 would soon find only emptied buckets. Returns the
-- fields and values read, and whether the hash may hold others (the scan goes on, or it ended
-- with fields it did not return: added during it, they are read by the next scan, from 0).
-- `peek`: keep the cursor where it was (a dry run changes nothing).
local function scan_step(hash_key, cursors_key, name, count, keep_ms, peek)
  local scanned = redis.call('HSCAN', hash_key, redis.call('HGET', cursors_key, name) or '0', 'COUNT', count)
  local found, ended = scanned[2], scanned[1] == '0'
  if peek then
    return found, not ended or redis.call('HLEN', hash_key) > #found / 2
  end
  if ended then
    redis.call('HDEL', cursors_key, name)
    return found, redis.call('HLEN', hash_key) > #found / 2
  end
  redis.call('HSET', cursors_key, name, scanned[1])
  redis.call('PEXPIRE', cursors_key, keep_ms)
  return found, true
end

-- A drained key (nothing waits, nothing holds a slot) keeps only its counters, and only while its
-- recent submissions are remembered (two generations: see submit.lua), or while a paced key's
-- interval since its last start runs, at most `horizon_ms`; a paused key keeps them `horizon_ms`.
-- Then nothing of it is left: its tickets start over, and its tokens go on in a new epoch above
-- every earlier one (epoch_base).
local function expire_if_idle(meta_key, queue_key, holders_key, horizon_ms)
  if redis.call('HLEN', holders_key) ~= 0 or redis.call('LLEN', queue_key) ~= 0 then
    return
  end
  if redis.call('HEXISTS', meta_key, 'limit_override') == 1 or redis.call('HEXISTS', meta_key, 'interval_override') == 1 then
    redis.call('PERSIST', meta_key)  -- an operator's word outlives the key's idle periods
    return
  end
  local keep = horizon_ms
  if not grants_held(meta_key) then
    local now = now_ms()
    local fields = redis.call('HMGET', meta_key, 'generation', 'last_start', 'interval', 'fence')
    local recent = 2 * (tonumber(fields[1]) or 0)
    local pacing = (tonumber(fields[2]) or 0) + (tonumber(fields[3]) or 0) - now
    -- Until a new epoch's first token would be above the last one handed out.
    local fenced = math.floor((tonumber(fields[4]) or 0) / 1000) - now + 1
    keep = math.min(horizon_ms, math.max(recent, pacing, fenced, 1))
  end
  redis.call('PEXPIRE', meta_key, keep)
end

-- A ticket waits for its pool (pool_wait.lua says when): its granted holder of dispatch `dispatch` no longer
-- starts, and the reaper asks its pool again at `ask_again_ms` from now. Returns 0, or 2 if it moved on.
local function wait_for_pool(meta_key, holders_key, ticket, dispatch, pool, ask_again_ms, now)
  local raw = redis.call('HGET', holders_key, ticket)
  local holder = raw and decode_holder(raw)
  if not holder or holder.state ~= 'g' or holder.dispatch ~= dispatch then
    return 2, 0
  end
  holder.state = 'w'
  holder.deadline = now + ask_again_ms
  redis.call('HSET', holders_key, ticket, encode_holder(holder))
  forget_marks(meta_key, holders_key, 'pool', ticket)
  redis.call('HSET', meta_key, 'pool:' .. ticket, pool)
  return 0, holder.deadline
end

-- A ticket's pool gave it a slot (pool_granted.lua says what follows). Returns code (0 granted, 2 it
-- holds no slot or blocks its key, 6 it runs), its dispatch, its message and the push's reply.
local function grant_for_pool(meta_key, holders_key, messages_key, wires_key, ticket, dispatch_timeout, now)
  local raw = redis.call('HGET', holders_key, ticket)
  local holder = raw and decode_holder(raw)
  if holder and holder.state == 'r' then
    return 6, 0, '', 0
  end
  if not holder or holder.state == 'b' then
    return 2, 0, '', 0
  end
  holder.state = 'g'
  holder.dispatch = holder.dispatch + 1
  holder.deadline = now + dispatch_timeout
  redis.call('HSET', holders_key, ticket, encode_holder(holder))
  redis.call('HDEL', meta_key, 'pool:' .. ticket)
  local pushed = push_reply(wires_key, ticket, holder.dispatch)
  return 0, holder.dispatch, redis.call('HGET', messages_key, ticket) or '', pushed
end
