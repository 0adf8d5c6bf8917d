--[[
  An operator's limit and rate, a key's (override.lua) or a pool's (pool_override.lua): kept in its meta.
]]

-- Set or clear meta's "limit_override" and "interval_override" as typed: '' clears one (its tasks' own
-- again), '-' leaves it, else the number.
local function set_overrides(meta_key, limit, interval_ms)
  for field, value in pairs({limit_override = limit, interval_override = interval_ms}) do
    if value == '' then
      redis.call('HDEL', meta_key, field)
    elseif value ~= '-' then
      redis.call('HSET', meta_key, field, tonumber(value))
    end
  end
end
