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

local members = {}
for i = 2, #ARGV do
  members[#members + 1] = ARGV[i]
end
return pool_give_back(KEYS[1], KEYS[2], KEYS[3], members, tonumber(ARGV[1]), pool_now_ms())
