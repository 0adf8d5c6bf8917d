--[[
  Helpers shared by the gate scripts.

  A holder record (one field of the holders hash, one per occupied slot):
    "<state>|<dispatch>|<token>|<deadline_ms>|<attempts>"
  state     g = granted, its message published but not started; r = running
  dispatch  generation of the message allowed to start it (1, then +1 per retry)
  token     fencing token of the running attempt (0 while granted)
  deadline  server-clock ms: lease end when running, dispatch timeout when granted
  attempts  how many times the ticket has started
]]

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function decode_holder(raw)
  local state, dispatch, token, deadline, attempts =
    string.match(raw, '^(%a)|(%d+)|(%d+)|(%d+)|(%d+)$')
  return {
    state = state,
    dispatch = tonumber(dispatch),
    token = tonumber(token),
    deadline = tonumber(deadline),
    attempts = tonumber(attempts),
  }
end

local function encode_holder(h)
  return string.format('%s|%d|%d|%d|%d', h.state, h.dispatch, h.token, h.deadline, h.attempts)
end

-- Grant parked tickets, oldest first, while the key has a free slot and is
-- not paused. Appends ticket, dispatch, message for each grant to `out`.
local function grant_waiting(meta_key, queue_key, messages_key, holders_key, limit, deadline, out)
  if redis.call('HEXISTS', meta_key, 'paused') == 1 then
    return out
  end
  while redis.call('HLEN', holders_key) < limit do
    local ticket = redis.call('LPOP', queue_key)
    if not ticket then
      break
    end
    redis.call('HSET', holders_key, ticket, encode_holder({
      state = 'g', dispatch = 1, token = 0, deadline = deadline, attempts = 0,
    }))
    out[#out + 1] = tonumber(ticket)
    out[#out + 1] = 1
    out[#out + 1] = redis.call('HGET', messages_key, ticket)
  end
  return out
end

-- A drained key keeps only its counters, and those only for `horizon_ms`.
local function expire_if_idle(meta_key, queue_key, holders_key, horizon_ms)
  if redis.call('HLEN', holders_key) == 0 and redis.call('LLEN', queue_key) == 0 then
    redis.call('PEXPIRE', meta_key, horizon_ms)
  end
end
