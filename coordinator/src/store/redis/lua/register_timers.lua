-- register_timers: files slots of a Redis Cluster that now hold timers of one agent, so that
-- sweeps read them (timers.rs says why the registry exists and what it promises).
-- KEYS: 1 the agent's slot registry (sorted set: slot -> at most its earliest timer),
--   2 the registry's generations (hash: slot -> how many times it was registered).
-- ARGV: pairs slot, due_ms (the earliest timer just written in that slot).
-- A slot's score only goes down here (`LT`); its generation goes up, so that a sweep which read
-- the slot before this write cannot raise the score past it (raise_slots.lua).

for i = 1, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], 'LT', ARGV[i + 1], ARGV[i])
  redis.call('HINCRBY', KEYS[2], ARGV[i], 1)
end
return #ARGV / 2
