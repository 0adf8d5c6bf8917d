--[[
  Recover one key's holders whose deadline passed (server clock):
  - a running ticket whose lease expired (its worker died or stalled) is
    re-dispatched, up to its max_lost; past that it fails and frees its slot,
    or, if its task blocks its key on failure, keeps it: the key is blocked;
  - a granted ticket never started within the dispatch timeout (its message
    was lost) has its message published again, same dispatch.
  Then the freed slots are granted to parked tickets. Outcomes of finished
  runs older than the grace (their worker died before writing the record)
  are handed back to be written, about a hundred per call; the caller deletes
  them once written.

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] outcomes  KEYS[6] scan cursors
  KEYS[7] wires     HASH ticket -> its message's broker template (see common.lua's push_granted)
  ARGV[1] dispatch_timeout_ms
  ARGV[2] idle_horizon_ms
  ARGV[3] dry_run: dry run (1 = report what would be done, change nothing)
  ARGV[4] outcome_grace_ms: grace of an outcome before the reaper writes it, ms
  ARGV[5] release: ticket to recover now whatever its deadline ('' = none): an operator
          releasing a stuck holder; a granted one is published with its next dispatch,
          so that a second release of the same dispatch is told apart
  ARGV[6] republish_before: server ms: also publish again every granted ticket whose dispatch
          deadline is at or before it ('' = none): grants whose message a
          broker connection lost may have stranded
  ARGV[7] released_dispatch: with ARGV[5]: the dispatch of the ticket the operator released ('' = any):
          a ticket that moved on since (released already, started again) is left alone
  ARGV[8] released_unstarted: with ARGV[5]: 1 = release the ticket only if it was granted and has not
          started (a release of many tasks at once, which never frees a running one); '' or 0 = any

  Returns {next_deadline_ms, action1, ticket1, dispatch1, attempts1, message1, pushed1, stopped1, action2, ...}
    next_deadline_ms  earliest deadline left among the key's holders, -1 if none
    action  'redispatch' | 'fail' | 'republish'  (publish message with dispatch, or fail the ticket)
            'pool'                               (it waits for its pool: ask the pool named in
                                                 message again, and publish it if given a slot)
            'block'                              (it failed and now blocks its key)
            'grant'                              (a parked ticket took a freed slot: publish it)
            'outcome'                            (message is an unwritten record of a finished run)
    pushed  1 = the message was pushed to the broker here (see push_granted); 0 or a refusal
            (common.lua's push_reply) = publish it
            (a 'republish' never is: its template is dropped, and its stored message is published)
    stopped '<since_ms>|<how>|<by>' for a stopped run's end (see stop.lua), else ''
]]
--- @include "common"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local dispatch_timeout = tonumber(ARGV[1])
local horizon = tonumber(ARGV[2])
local dry_run = ARGV[3] == '1'
local grace = tonumber(ARGV[4])
local release = ARGV[5]
local republish_before = tonumber(ARGV[6]) or -1
local released_dispatch = tonumber(ARGV[7])
local released_unstarted = ARGV[8] == '1'

local now = now_ms()
local out = {-1}
local freed = false
local holders = redis.call('HGETALL', holders_key)
for i = 1, #holders, 2 do
  local ticket, holder = holders[i], decode_holder(holders[i + 1])
  local released = ticket == release and (released_dispatch == nil or released_dispatch == holder.dispatch)
    and (not released_unstarted or holder.state == 'g')
  if holder.state ~= 'b' and (holder.deadline <= now or released
      or (holder.state == 'g' and holder.deadline <= republish_before)) then
    local message = redis.call('HGET', messages_key, ticket)
    local stopped = holder.state == 'r' and stop_noted(meta_key, ticket, holder.dispatch)
    local action
    if holder.state == 'w' then
      action = 'pool'
      holder.deadline = now + dispatch_timeout
      message = redis.call('HGET', meta_key, 'pool:' .. ticket) or ''
    elseif holder.state == 'g' then
      action = 'republish'
      holder.deadline = now + dispatch_timeout
      if released then
        holder.dispatch = holder.dispatch + 1
      end
    elseif holder.lost < holder.max_lost then
      action = 'redispatch'
      holder.state, holder.token = 'g', 0
      holder.dispatch = holder.dispatch + 1
      holder.lost = holder.lost + 1
      holder.deadline = now + dispatch_timeout
    elseif holder.block == 1 then
      action = 'block'
    else
      action = 'fail'
    end
    if not dry_run then
      if action == 'block' then
        block_ticket(meta_key, holders_key, ticket, holder)
      elseif action == 'fail' then
        redis.call('HDEL', holders_key, ticket)
        drop_message(messages_key, KEYS[7], ticket)
        freed = true
      else
        redis.call('HSET', holders_key, ticket, encode_holder(holder))
      end
    end
    local note = ''
    if stopped then
      note = string.format('%d|%s|%s', stopped.since, stopped.how, stopped.by)
      if not dry_run then
        redis.call('HDEL', meta_key, 'stop:' .. ticket)
      end
    end
    local pushed = 0
    if not dry_run and action == 'redispatch' then
      pushed = push_reply(KEYS[7], ticket, holder.dispatch)
    elseif not dry_run and action == 'republish' then
      -- Granted and never started: the message the gate pushed may be one no worker accepts (a
      -- template rewritten in Redis). The caller publishes it from the stored message, which it
      -- validates; a bad one fails its task and its key moves on.
      redis.call('HDEL', KEYS[7], ticket)
    end
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6], out[n + 7] =
      action, tonumber(ticket), holder.dispatch, holder.attempts, message, pushed, note
  end
end

if freed then
  local limit = tonumber(redis.call('HGET', meta_key, 'limit') or '1')
  local granted = grant_waiting(meta_key, queue_key, messages_key, holders_key, KEYS[7], limit,
    now + dispatch_timeout, {})
  for i = 1, #granted, 4 do
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6], out[n + 7] =
      'grant', granted[i], granted[i + 1], 0, granted[i + 2], granted[i + 3], ''
  end
  expire_if_idle(meta_key, queue_key, holders_key, horizon)
end

for _, raw in ipairs(redis.call('HVALS', holders_key)) do
  local holder = decode_holder(raw)
  if holder.state ~= 'b' and (out[1] < 0 or holder.deadline < out[1]) then
    out[1] = holder.deadline
  end
end

-- A step of about a hundred (HSCAN): the work stays bounded however many runs ended while
-- their records could not be written; the rest are read on the next visits, soon.
local outcomes, more = scan_step(KEYS[5], KEYS[6], 'outcomes', 100, horizon, dry_run)
if more and (out[1] < 0 or now < out[1]) then
  out[1] = now
end
for i = 1, #outcomes, 2 do
  local at, record = string.match(outcomes[i + 1], '^(%d+)|(.*)$')
  if tonumber(at) + grace <= now then
    local n = #out
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6], out[n + 7] =
      'outcome', 0, 0, 0, record, 0, ''
  end
  -- Look again once it is due, or to see it was deleted.
  if out[1] < 0 or now + grace < out[1] then
    out[1] = now + grace
  end
end
return out
