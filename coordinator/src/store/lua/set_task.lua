-- set_task: overwrites a task only if it exists (a late lease update for a finished task is
-- dropped). KEYS: 1 tasks hash. ARGV: 1 task key, 2 task bytes. Replies 1 if set, 0 if not.

if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
