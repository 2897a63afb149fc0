-- swap_tasks: compare-and-swap of tasks, each on its own (one may succeed and the next fail).
-- KEYS: the tasks hash of each swap's run, in order.
-- ARGV: 1 timer prefix (`P:timers:`), then per swap 5 values: member (`<run id>/<task key>`),
--   task key, expected bytes, has_new ("1" or "0"), new bytes (empty when has_new is "0").
-- A swap happens only if the task is stored with exactly the expected bytes: it then stores the
-- new bytes (or removes the task) and moves its timer. Replies with one 1 (swapped) or 0 per swap.
-- Needs decode_task, check_timer_key, unset_timer and set_timer from transition.lua.

local prefix = ARGV[1]
-- Checks first (Redis does not roll a script back): a timer set of another type refuses the batch.
for s = 1, #KEYS do
  local a = 2 + (s - 1) * 5
  local err = check_timer_key(prefix, redis.call('HGET', KEYS[s], ARGV[a + 1]))
  if not err and ARGV[a + 3] == '1' then
    err = check_timer_key(prefix, ARGV[a + 4])
  end
  if err then
    return err
  end
end
local swapped = {}
for s = 1, #KEYS do
  local a = 2 + (s - 1) * 5
  local member, key, expected = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local current = redis.call('HGET', KEYS[s], key)
  if current and current == expected then
    unset_timer(prefix, member, current)
    if ARGV[a + 3] == '1' then
      redis.call('HSET', KEYS[s], key, ARGV[a + 4])
      set_timer(prefix, member, ARGV[a + 4])
    else
      redis.call('HDEL', KEYS[s], key)
    end
    swapped[s] = 1
  else
    swapped[s] = 0
  end
end
return swapped
