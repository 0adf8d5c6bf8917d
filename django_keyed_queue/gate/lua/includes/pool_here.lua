--[[
  A pool on the keys' own server (a single Redis, or a Sentinel's master): start.lua and finish.lua ask
  and give back a pooled ticket's slot in their own call, and tell the keys of the tickets a freed slot
  goes to in it too, whose state they reach by name (as push_granted reaches the broker's queues). On a
  Redis Cluster the pool's slot is elsewhere: the gate asks the pool in a call of its own (gate/pools.py).
  Included after common.lua and pool.lua.
]]

-- The names of a key's state, as gate/keys.py's KeyNames builds them (the same escapes).
local function key_names(key)
  local escaped = string.gsub(key, '[%%{}]', {['%'] = '%25', ['{'] = '%7B', ['}'] = '%7D'})
  local base = 'keyed_queue:{' .. escaped .. '}'
  return base .. ':meta', base .. ':holders', base .. ':messages', base .. ':wires'
end

-- The keys of `members`, to whom the pool just gave slots, publish them again (grant_for_pool); a member
-- whose ticket no longer holds its key's slot gives its pool slot back, and the next takes it. Appends
-- key, ticket, dispatch, message, pushed for each grant to `out`.
local function grant_members(members, running_key, ready_key, meta_key, grant_ms, dispatch_timeout, now, out)
  local i = 1
  while i <= #members do
    local ticket, key = string.match(members[i], '^(%d+)|(.*)$')
    local code, dispatch, message, pushed = 2, 0, '', 0
    if ticket then
      local meta, holders, messages, wires = key_names(key)
      code, dispatch, message, pushed = grant_for_pool(meta, holders, messages, wires, ticket, dispatch_timeout, now)
    end
    if code == 0 then
      local n = #out
      out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = key, tonumber(ticket), dispatch, message, pushed
    elseif code == 2 then
      for _, next_member in ipairs(pool_give_back(running_key, ready_key, meta_key, {members[i]}, grant_ms, now)) do
        members[#members + 1] = next_member
      end
    end
    i = i + 1
  end
  return out
end
