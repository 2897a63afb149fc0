-- create_run: writes a run's header and its first transition (version 1), or nothing.
-- KEYS: 1 to 8 see transition.lua; 9 the run's void marker (`P:run:{R}:void`), which
-- settle_create.lua writes for a run whose create it settled as never done.
-- ARGV: 1 workflow, 2 workflow_id, 3 input, 4 created_ms, 5 traceparent (may be empty),
-- 6 submitted_by (may be empty), 7.. the first transition.
-- Replies: 1 (the version), or an error EXISTS ... / VOIDED ... / FENCED ... / CORRUPT <why>. (An
-- error needs words after its code: redis-rs reads a lone word as a plain ERR.)

if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('EXISTS run already exists')
end
if redis.call('EXISTS', KEYS[9]) == 1 then
  return redis.error_reply('VOIDED run was voided')
end
-- Without its header a run does not exist, so none of its other keys should either.
for k = 2, 8 do
  if redis.call('EXISTS', KEYS[k]) == 1 then
    return redis.error_reply('CORRUPT run has no header but its key ' .. KEYS[k] .. ' exists')
  end
end

local t = read_transition(7)
local err = check_fences(t) or check_results(t) or check_timer_types(t)
if err then
  return err
end

redis.call('HSET', KEYS[1],
  'workflow', ARGV[1],
  'workflow_id', ARGV[2],
  'input', ARGV[3],
  'created_ms', ARGV[4],
  'updated_ms', ARGV[4],
  'traceparent', ARGV[5],
  'submitted_by', ARGV[6],
  'version', 0)
return write_transition(t, false, false)
