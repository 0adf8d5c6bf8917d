--[[
  Withdraw a ticket that has not started: a parked one leaves the queue; a
  granted one frees its slot for the next ticket. A running ticket stays.

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] recent    KEYS[6] recent, older generation (the task ids submit remembers)
  KEYS[7] unwritten (submission records whose rows are not written yet)
  KEYS[8] wires     HASH ticket -> its message's broker template (see common.lua's push_granted)
  ARGV[1] ticket
  ARGV[2] limit: slots per key; '' = the key's own, kept at submission
  ARGV[3] dispatch_timeout_ms
  ARGV[4] idle_horizon_ms
  ARGV[5] forget: (1 = the submission of this ticket failed before anyone saw it: give
          the ticket number back, and drop the key entirely if it was all there was)
  ARGV[6] failed: 1 = the submission failed: drop its record if its row is not written yet
  ARGV[7] dispatch: withdraw the ticket only if it is granted with this dispatch ('' = in any state)
  ARGV[8] task_id: withdraw the ticket only if its stored message is this task's ('' = any)
  ARGV[9] failed_for_good: 1 = its task failed for good without starting (no worker knows it): a granted ticket
          whose stored message says its task blocks its key on failure ("on_failure": "block")
          is blocked instead of withdrawn

  Returns {code, ticket1, dispatch1, message1, pushed1, ...}
    code 0 OK           withdrawn; the listed tickets are now granted: those not pushed must be published
    code 2 NOT_GRANTED  the ticket is unknown to the gate (finished or never taken)
    code 6 RUNNING      the ticket is running; nothing changed
    code 11 BLOCKED     the ticket failed and blocks its key (unblock.lua withdraws it): it did before
                        (nothing changed), or ARGV[9] blocked it now
]]
--- @include "common"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ticket = ARGV[1]
local limit = tonumber(ARGV[2]) or tonumber(redis.call('HGET', meta_key, 'limit') or '1')
local dispatch_timeout = tonumber(ARGV[3])
local horizon = tonumber(ARGV[4])
local forget = ARGV[5] == '1'

-- The ticket's stored message, decoded, if it is a JSON object (anyone may have written it).
local function stored_message()
  local ok, stored = pcall(cjson.decode, redis.call('HGET', messages_key, ticket) or '')
  if ok and type(stored) == 'table' then
    return stored
  end
end

local raw = redis.call('HGET', holders_key, ticket)
local holder = raw and decode_holder(raw)
if ARGV[7] ~= '' and not (holder and holder.state == 'g' and holder.dispatch == tonumber(ARGV[7])) then
  return {2}
end
local stored = (ARGV[8] ~= '' or ARGV[9] == '1') and stored_message()
if ARGV[8] ~= '' and not (stored and stored.id == ARGV[8]) then
  return {2}
end
if holder then
  if holder.state == 'r' then
    return {6}
  elseif holder.state == 'b' then
    return {11}
  elseif ARGV[9] == '1' and stored and stored.on_failure == 'block' then
    block_ticket(meta_key, holders_key, ticket, holder)
    return {11}
  end
  redis.call('HDEL', holders_key, ticket)
elseif redis.call('LREM', queue_key, 1, ticket) == 0 then
  return {2}
end

if forget then
  stored = stored_message()
  if stored and type(stored.id) == 'string' then
    for _, remembered in ipairs({KEYS[5], KEYS[6]}) do
      if redis.call('HGET', remembered, stored.id) == ticket then
        redis.call('HDEL', remembered, stored.id)
      end
    end
  end
end
drop_message(messages_key, KEYS[8], ticket)
if ARGV[6] == '1' then
  redis.call('HDEL', KEYS[7], ticket)
end
if forget and tonumber(redis.call('HGET', meta_key, 'seq')) == tonumber(ticket) then
  if redis.call('HINCRBY', meta_key, 'seq', -1) == 0
    and redis.call('HEXISTS', meta_key, 'fence') == 0
    and redis.call('HEXISTS', meta_key, 'paused') == 0 then
    redis.call('DEL', meta_key)
  end
end
local out = grant_waiting(meta_key, queue_key, messages_key, holders_key, KEYS[8], limit,
  now_ms() + dispatch_timeout, {0})
expire_if_idle(meta_key, queue_key, holders_key, horizon)
return out
