--[[
  Follow a key's chain of coalesced replacements from one task as far as the gate keeps it: the
  record of a superseded ticket, kept until its row is written (common.lua's supersede_record),
  names the task that replaced it; that task's ticket is found among the key's recent submissions.
  A record is followed only if it is the given task's own (tickets start over once a key drains).
  Reads only.

  KEYS[1] unwritten   HASH ticket -> submission record, "<ticket>s" -> a superseded ticket's
  KEYS[2] recent      HASH task id -> ticket of this generation's submissions (submit.lua)
  KEYS[3] older       the previous generation
  ARGV[1] task_id: the task to start from
  ARGV[2] ticket: its ticket, if known ('' = look it up in recent, then in older)
  ARGV[3] max_hops: the most replacements to follow

  Returns {task id, hops}: the last task of the chain the gate keeps and how many replacements led
  to it; {ARGV[1], 0} if the gate keeps no replacement of it
]]

-- The task that replaced task `id` while it held `ticket`, if the gate keeps the record; else nil.
local function replaced_by(id, ticket)
  if not ticket or ticket == '' then
    return nil
  end
  local kept = redis.call('HGET', KEYS[1], ticket .. 's')
  local record = kept and string.match(kept, '^s|%d+|(.*)$')
  local ok, data = pcall(cjson.decode, record or '')
  if ok and type(data) == 'table' and data.task_id == id and type(data.superseded_by) == 'string'
    and data.superseded_by ~= '' then
    return data.superseded_by
  end
  return nil
end

local id, ticket, max_hops = ARGV[1], ARGV[2], tonumber(ARGV[3])
local hops = 0
while hops < max_hops do
  local by = replaced_by(id, ticket)
    or replaced_by(id, redis.call('HGET', KEYS[2], id))
    or replaced_by(id, redis.call('HGET', KEYS[3], id))
  if not by then
    break
  end
  id, ticket, hops = by, '', hops + 1
end
return {id, hops}
