--[[
  The submission records of a key whose rows are not written yet, each with
  the ticket's stored message (false once the ticket finished or was withdrawn):
  about ARGV[1] of them (one HSCAN step), so the call's work never grows with
  the key's depth; the caller asks again for the rest once it wrote these.

  KEYS[1] unwritten      KEYS[2] messages
  ARGV[1] about how many records to read (HSCAN's COUNT)

  Returns {more, ticket1, record1, message1, ticket2, ...}; more is 1 if the key keeps
  records not returned, else 0; a record is "<d or w>|<server ms>|<record>" as submit keeps it.
]]

local scanned = redis.call('HSCAN', KEYS[1], 0, 'COUNT', tonumber(ARGV[1]))
local records = scanned[2]
local out = {scanned[1] == '0' and 0 or 1}
for i = 1, #records, 2 do
  out[#out + 1] = records[i]
  out[#out + 1] = records[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], records[i])
end
return out
