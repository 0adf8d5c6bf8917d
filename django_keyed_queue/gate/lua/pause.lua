--[[
  Pause or resume a key. A paused key grants nothing: running tasks finish,
  submissions queue in order. Resuming grants the waiting tickets up to the
  key's limit.

  KEYS[1] meta      KEYS[2] queue      KEYS[3] messages      KEYS[4] holders
  KEYS[5] wires     HASH ticket -> its message's broker template (see common.lua's push_granted)
  ARGV[1] pause: 1 = pause, 0 = resume
  ARGV[2] dispatch_timeout_ms
  ARGV[3] idle_horizon_ms
  ARGV[4] paused_by: on pause: who paused it (shown to operators; '' = not said)

  Returns {code, ticket1, dispatch1, message1, pushed1, ...}
    code 0 OK          done; on resume, the listed tickets are now granted: those not pushed must be published
    code 13 NOT_PAUSED on resume: the key was not paused (resumed meanwhile); nothing changed
    code 14 ALREADY_PAUSED on pause: the key was paused already; its pause (when, by whom) is kept
]]
--- @include "common"

local meta_key, queue_key, messages_key, holders_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if ARGV[1] == '1' then
  if redis.call('HEXISTS', meta_key, 'paused') == 1 then
    return {14}
  end
  -- When (server clock) and by whom, for the operator who finds the key paused; 'paused' alone decides.
  redis.call('HSET', meta_key, 'paused', now_ms(), 'paused_by', ARGV[4] or '')
  redis.call('PERSIST', meta_key)
  return {0}
end
if redis.call('HDEL', meta_key, 'paused') == 0 then
  return {13}
end
redis.call('HDEL', meta_key, 'paused_by')
local limit = tonumber(redis.call('HGET', meta_key, 'limit') or '1')
local out = grant_waiting(meta_key, queue_key, messages_key, holders_key, KEYS[5], limit,
  now_ms() + tonumber(ARGV[2]), {0})
expire_if_idle(meta_key, queue_key, holders_key, tonumber(ARGV[3]))
return out
