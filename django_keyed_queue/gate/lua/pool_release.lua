--[[
  Members give their pool slots back (their runs ended, or their tickets no longer wait); with
  none, it only returns expired slots (the reaper's pass). Either way the oldest waiting members
  take the free slots.

  KEYS[1] running   KEYS[2] ready   KEYS[3] meta    (see includes/pool.lua)
  ARGV[1] grant_ms: how long a slot given to a waiting member is held for its start
  ARGV[2], ARGV[3], ...  members

  Returns {member granted 1, member granted 2, ...}: their keys must publish them (pool_granted)
]]
--- @include "pool"

local running_key, ready_key, meta_key = KEYS[1], KEYS[2], KEYS[3]
for i = 2, #ARGV do
  redis.call('ZREM', running_key, ARGV[i])
  redis.call('ZREM', ready_key, ARGV[i])
  redis.call('HDEL', meta_key, 'at:' .. ARGV[i])
end
local limit = pool_settings(meta_key, nil, nil)
return pool_refill(running_key, ready_key, meta_key, limit, tonumber(ARGV[1]), pool_now_ms())
