--[[
  Move keys in an index after the reaper visited them, unless a call indexed
  them meanwhile (every such call changes the score, even one that keeps an
  earlier score: the score is no longer the one the reaper read); or
  release a writer's claims on the unwritten index, unless a submission
  scored the key again.

  KEYS[1] the index (ZSET logical key -> ms when it may need the reaper; or the unwritten index)
  ARGV[1], ARGV[2], ARGV[3], ...  moves: key, score read, next score (-1 = remove), repeated

  Returns the number of keys moved or removed.
]]

local index_key = KEYS[1]
local moved = 0
for i = 1, #ARGV, 3 do
  local key, seen, next_score = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local score = redis.call('ZSCORE', index_key, key)
  if score and tonumber(score) == tonumber(seen) then
    if next_score < 0 then
      redis.call('ZREM', index_key, key)
    else
      redis.call('ZADD', index_key, next_score, key)
    end
    moved = moved + 1
  end
end
return moved
