-- due_slots: the slots of a Redis Cluster whose earliest timer of one agent may be due.
-- KEYS: 1 the agent's slot registry, 2 its generations (see register_timers.lua).
-- ARGV: 1 now (ms), 2 how many slots at most.
-- Replies with a flat list, lowest score first: slot, score, generation, ...

local rows = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local reply = {}
for r = 1, #rows, 2 do
  reply[#reply + 1] = rows[r]
  reply[#reply + 1] = rows[r + 1]
  reply[#reply + 1] = redis.call('HGET', KEYS[2], rows[r]) or '0'
end
return reply
