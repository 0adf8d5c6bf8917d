--[[
  Extend the leases one worker process holds on one key, in one call.

  KEYS[1] holders
  ARGV[1] lease_ms: lease
  ARGV[2], ARGV[3], ...  leases: ticket, token pairs

  Returns {renewed1, renewed2, ...}  1 = extended, 0 = lost (fenced or finished)
]]
--- @include "common"

local holders_key = KEYS[1]
local deadline = now_ms() + tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 2 do
  local ticket, token = ARGV[i], tonumber(ARGV[i + 1])
  local holder = running_holder(holders_key, ticket)
  local renewed = 0
  if holder and holder.token == token then
    holder.deadline = deadline
    redis.call('HSET', holders_key, ticket, encode_holder(holder))
    renewed = 1
  end
  out[#out + 1] = renewed
end
return out
