-- settle_create: settles a create_run whose answer was lost. Scripts of one slot run one at a
-- time, so this and the create are one before the other: the create was done (the header exists),
-- or it was not and now never will be (the void marker makes create_run.lua refuse it).
-- KEYS: 1 the run's header, 2 its void marker, 3 its barrier (`P:run:{R}:barrier`).
-- ARGV: 1 "1" when a WAIT follows, so that something is written for it to count, else "0".
-- Replies: 1 (the run exists) or 0 (it does not, and its id is voided).

if redis.call('EXISTS', KEYS[1]) == 1 then
  if ARGV[1] == '1' then
    redis.call('SET', KEYS[3], 1, 'PX', 10000)
  end
  return 1
end
redis.call('SET', KEYS[2], 1)
return 0
