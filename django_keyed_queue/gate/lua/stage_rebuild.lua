--[[
  One chunk of a rebuild (see rebuild.lua): append tickets and their messages to
  a staging queue and hash of the rebuild's own, which nothing else reads, so
  that each call's work is bounded however deep the key.

  KEYS[1] staged queue      KEYS[2] staged messages
  ARGV[1] keep_ms: how long the staging is kept if the rebuild never ends, ms
  ARGV[2], ARGV[3], ...  waiting: ticket, message, repeated, oldest first

  Returns {code}
    code 0 OK      staged
]]
--- @include "common"

for i = 2, #ARGV, 2 do
  redis.call('RPUSH', KEYS[1], ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return {0}
