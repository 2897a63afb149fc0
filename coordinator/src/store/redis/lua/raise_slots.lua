-- raise_slots: after a sweep read slots, files what it found: each slot's earliest timer, or
-- the slot leaves the registry when it holds none.
-- KEYS: 1 the agent's slot registry, 2 its generations (see register_timers.lua).
-- ARGV: triples slot, generation read before the slot was read, earliest timer ('' for none).
-- A slot registered since the sweep read its generation is left as it is: the sweep may have
-- missed the timer that registration was for.

local raised = 0
for i = 1, #ARGV, 3 do
  local slot = ARGV[i]
  if (redis.call('HGET', KEYS[2], slot) or '0') == ARGV[i + 1] then
    if ARGV[i + 2] == '' then
      redis.call('ZREM', KEYS[1], slot)
    else
      redis.call('ZADD', KEYS[1], ARGV[i + 2], slot)
    end
    raised = raised + 1
  end
end
return raised
