--[[
  The submission records of a key whose rows are not written yet, each with
  the ticket's stored message (false once the ticket finished or was withdrawn).

  KEYS[1] unwritten      KEYS[2] messages

  Returns {ticket1, record1, message1, ticket2, ...}; a record is
  "<d or w>|<server ms>|<record>" as submit keeps it.
]]

local records = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #records, 2 do
  out[#out + 1] = records[i]
  out[#out + 1] = records[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], records[i])
end
return out
