--[[
  Set or clear an operator's limit and rate for a key, over what its tasks give. They apply from
  the next grant and start on; a raised limit grants the waiting tickets up to it at once, and a
  lowered one takes back the grants of tickets that never started, newest first, down to it: they
  wait again at the front of the queue, in ticket order (a published message of theirs that
  reaches a worker is dropped: its ticket holds no slot). A ticket that started once (a retry, a
  recovery) keeps its grant. They are kept in meta, which then does not expire (expire_if_idle),
  until cleared. A faster rate publishes again a granted ticket that waits for the slower one.

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] wires     HASH ticket -> its message's broker template (see common.lua's push_granted)
  ARGV[1] limit: slots per key ('' = its tasks' own again, '-' = unchanged)
  ARGV[2] interval_ms: least ms between two starts ('' = its tasks' own again, '-' = unchanged)
  ARGV[3] dispatch_timeout_ms
  ARGV[4] idle_horizon_ms

  Returns {code, n, withdrawn1, ..., withdrawnN, ticket1, dispatch1, message1, pushed1, ...}
    code 0 OK          set; the n withdrawn tickets wait again; the listed tickets are now granted:
                       those not pushed must be published
]]
--- @include "common"
--- @include "overrides"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local task_interval = tonumber(redis.call('HGET', meta_key, 'interval') or '0')
local interval_before = effective_interval(meta_key, task_interval)
set_overrides(meta_key, ARGV[1], ARGV[2])
local limit = tonumber(redis.call('HGET', meta_key, 'limit') or '1')
local held = redis.call('HGETALL', holders_key)
local excess = #held / 2 - effective_limit(meta_key, limit)
local unstarted = {}
for i = 1, #held, 2 do
  local holder = decode_holder(held[i + 1])
  if holder.state == 'g' and holder.attempts == 0 then
    unstarted[#unstarted + 1] = tonumber(held[i])
  end
end
table.sort(unstarted)
local withdrawn = {}
for i = #unstarted, 1, -1 do
  if excess <= 0 then
    break
  end
  redis.call('HDEL', holders_key, unstarted[i])
  redis.call('HDEL', meta_key, 'now:' .. unstarted[i])  -- granted again from dispatch 1: not run now
  redis.call('LPUSH', queue_key, unstarted[i])  -- the newest first: they end in ticket order
  withdrawn[#withdrawn + 1] = unstarted[i]
  excess = excess - 1
end
local out = {0, #withdrawn}
for i = #withdrawn, 1, -1 do
  out[#out + 1] = withdrawn[i]
end
out = grant_waiting(meta_key, queue_key, messages_key, holders_key, KEYS[5], limit,
  now_ms() + tonumber(ARGV[3]), out)
-- A faster rate: a granted ticket told to wait for the slower one goes out again, with its next
-- dispatch, and its start asks the new rate (its waiting copy is dropped when it comes).
local last_start = tonumber(redis.call('HGET', meta_key, 'last_start') or '0')
if effective_interval(meta_key, task_interval) < interval_before and last_start + interval_before > now_ms() then
  for i = 1, #held, 2 do
    local raw = redis.call('HGET', holders_key, held[i])
    local holder = raw and decode_holder(raw)
    if holder and holder.state == 'g' then
      holder.dispatch = holder.dispatch + 1
      holder.deadline = now_ms() + tonumber(ARGV[3])
      redis.call('HSET', holders_key, held[i], encode_holder(holder))
      redis.call('HDEL', KEYS[5], held[i])
      local n = #out
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] =
        tonumber(held[i]), holder.dispatch, redis.call('HGET', messages_key, held[i]), 0
    end
  end
end
if redis.call('HLEN', holders_key) == 0 and redis.call('LLEN', queue_key) == 0
  and redis.call('HLEN', meta_key) == 0 then
  redis.call('DEL', meta_key)  -- a key that never had a task: nothing to keep
else
  expire_if_idle(meta_key, queue_key, holders_key, tonumber(ARGV[4]))
end
return out
