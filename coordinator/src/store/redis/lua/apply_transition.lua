-- apply_transition: applies a transition if the run is at the expected version, or nothing.
-- KEYS: see transition.lua.
-- ARGV: 1 expected version (decimal), 2.. the transition.
-- Replies: {new version, status before the transition}, or an error NOTFOUND /
-- CONFLICT <actual version> / FENCED <task key> <current attempt or none> / CORRUPT <why>.

local got = redis.call('HMGET', KEYS[1], 'version', 'writes')
local version = got[1]
if not version then
  return redis.error_reply('NOTFOUND run not found')
end
if version ~= ARGV[1] then
  return redis.error_reply('CONFLICT ' .. version)
end

local t = read_transition(2)
local err = check_types(t) or check_fences(t) or check_results(t) or check_timer_types(t)
if err then
  return err
end
local before = redis.call('HGET', KEYS[1], 'status')
return {write_transition(t, before, got[2]), before}
