--[[
  Set or clear an operator's limit and rate for a pool, over what its tasks give. They apply from
  the pool's next slot and start on; a raised limit gives free slots to the waiting tickets at
  once, and a lowered one lets the running keep their slots (no run is stopped): the next waits
  until fewer run than the new limit. Kept in meta until cleared.

  KEYS[1] running   KEYS[2] ready   KEYS[3] meta    (see includes/pool.lua)
  ARGV[1] limit: most holding a slot at once ('' = its tasks' own again, '-' = unchanged)
  ARGV[2] interval_ms: least ms between two starts ('' = its tasks' own again, '-' = unchanged)
  ARGV[3] grant_ms: how long a slot given to a waiting member is held for its start

  Returns {member granted 1, member granted 2, ...}: their keys must publish them (pool_granted)
]]
--- @include "pool"
--- @include "overrides"

local running_key, ready_key, meta_key = KEYS[1], KEYS[2], KEYS[3]
set_overrides(meta_key, ARGV[1], ARGV[2])
local limit = pool_settings(meta_key, nil, nil)
return pool_refill(running_key, ready_key, meta_key, limit, tonumber(ARGV[3]), pool_now_ms())
