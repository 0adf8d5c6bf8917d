--[[
  A ticket's pool gave it a slot (pool_acquire or pool_release returned its member): it is
  granted again with its next dispatch, and its message pushed to the broker if it can be (an
  earlier dispatch's message, still on its way, is refused at its start). A repeat is harmless:
  a granted ticket is published once more, with one more dispatch.

  KEYS[1] meta      KEYS[2] holders      KEYS[3] messages      KEYS[4] wires
  ARGV[1] ticket
  ARGV[2] dispatch_timeout_ms

  Returns {code, dispatch, message, pushed}
    code 0 OK            granted: publish the message with this dispatch unless pushed is 1
                         (common.lua's push_reply)
    code 2 NOT_GRANTED   the ticket holds no slot (finished, cancelled) or blocks its key: its
                         pool slot must be given back
    code 6 RUNNING       it runs already: its pool slot is its run's
]]
--- @include "common"

local code, dispatch, message, pushed = grant_for_pool(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], tonumber(ARGV[2]), now_ms())
if code == 6 then
  return {6, 0, '', 0}
elseif code == 2 then
  return {2, 0, '', 0}
end
return {0, dispatch, message, pushed}
