--[[
  An operator starts a granted ticket now: one waiting for its key's rate, or whose message waits
  out an eta (a debounce). Its message goes out again with the next dispatch (the caller publishes
  it without an eta), and that dispatch may start at once whatever the key's rate ("now:<ticket>"
  in meta, which rate_wait reads); the copy that waits is dropped when it comes (an older dispatch).

  KEYS[1] meta      KEYS[2] holders      KEYS[3] messages      KEYS[4] wires
  ARGV[1] ticket
  ARGV[2] dispatch: the grant's dispatch as the operator saw it
  ARGV[3] dispatch_timeout_ms

  Returns {code, dispatch, message}
    code 0 OK           published again with dispatch; message: its stored message
    code 2 NOT_GRANTED  the ticket is not granted with that dispatch (it started, ended or moved on)
]]
--- @include "common"

local meta_key, holders_key = KEYS[1], KEYS[2]
local ticket = ARGV[1]
local raw = redis.call('HGET', holders_key, ticket)
local holder = raw and decode_holder(raw)
if not holder or holder.state ~= 'g' or holder.dispatch ~= tonumber(ARGV[2]) then
  return {2, 0, ''}
end
holder.dispatch = holder.dispatch + 1
holder.deadline = now_ms() + tonumber(ARGV[3])
redis.call('HSET', holders_key, ticket, encode_holder(holder))
redis.call('HDEL', KEYS[4], ticket)  -- the template pushed for the earlier dispatch is not the one to send
forget_marks(meta_key, holders_key, 'now', ticket)
redis.call('HSET', meta_key, 'now:' .. ticket, holder.dispatch)
return {0, holder.dispatch, redis.call('HGET', KEYS[3], ticket) or ''}
