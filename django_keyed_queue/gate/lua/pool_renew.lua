--[[
  Running members hold their pool slots for another lease (a worker's heartbeat, beside its
  keys' leases). A member that no longer holds one is left out: its slot went back.

  KEYS[1] running
  ARGV[1] hold_ms
  ARGV[2], ARGV[3], ...  members

  Returns {1 or 0 per member: it held its slot and holds it hold_ms more}
]]
--- @include "pool"

local until_ms = pool_now_ms() + tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', 'GT', until_ms, ARGV[i])  -- a later start's hold stays
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
