-- reclaim_idempotency_key: gives an idempotency key whose run was voided a new run.
-- KEYS: 1 the key (`P:idempotency:<key>`).
-- ARGV: 1 what it holds when its run was voided (`<voided run id> <request sha256>`), 2 what it
-- is to hold (`<run id> <request sha256>`), 3 its time to live in seconds.
-- Replies: 1 (it holds ARGV[2] now: it held ARGV[1], or nothing), or what it holds instead.

local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then
  return held
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
