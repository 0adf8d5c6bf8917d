--[[
  The submission records of a key whose rows are not written yet, each with
  the ticket's stored message (false once the ticket finished or was withdrawn):
  about ARGV[1] of them (one HSCAN step, going on where the last step stopped), so
  the call's work never grows with the key's depth; the caller deletes the records
  it wrote, and asks again for the rest.

  KEYS[1] unwritten      KEYS[2] messages      KEYS[3] scan cursors
  ARGV[1] count: about how many records to read (HSCAN's COUNT)
  ARGV[2] keep_ms: how long a scan's cursor is kept, ms
  ARGV[3] min_age_ms: records kept for less than this are left, unread (0: every record)

  Returns {more, young, ticket1, record1, message1, ticket2, ...}; more is 1 if the key may keep
  records not scanned, else 0; young is the server ms of the oldest record left for its age (0:
  none); a record is "<d, w or s>|<server ms>|<record>" as submit keeps it.
]]
--- @include "common"

local records, more = scan_step(KEYS[1], KEYS[3], 'unwritten', tonumber(ARGV[1]), tonumber(ARGV[2]), false)
local now, min_age = now_ms(), tonumber(ARGV[3])
local young = 0
local out = {more and 1 or 0, 0}
for i = 1, #records, 2 do
  local at = min_age > 0 and tonumber(string.match(records[i + 1], '^[dws]|(%d+)|'))
  -- A time no submit wrote (past a day from now) is read, for the caller to refuse.
  if at and at > now - min_age and at < now + 86400000 then
    young = (young == 0 or at < young) and at or young
  else
    out[#out + 1] = records[i]
    out[#out + 1] = records[i + 1]
    out[#out + 1] = redis.call('HGET', KEYS[2], records[i])
  end
end
out[2] = young
return out
