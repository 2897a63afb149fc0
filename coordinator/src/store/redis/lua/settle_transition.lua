-- settle_transition: settles an apply_transition whose answer was lost, by its write id. Needs
-- remember_write and the lengths from transition.lua.
-- KEYS: 1 the run's header, 2 its barrier (`P:run:{R}:barrier`).
-- ARGV: 1 the version the write expected (decimal), 2 its write id, 3 "1" when a WAIT follows
-- (something is then written for it to count), else "0".
-- Replies: {outcome, version}, outcome one of
--   'done'    the write made version expected + 1;
--   'fenced'  the run was still at the expected version: the version is raised by one now, so the
--             write, should it still come, is a CONFLICT (a version only grows);
--   'passed'  other writes made version expected + 1: the write was not done, and never will be;
--   'unknown' the write that made version expected + 1 is older than the writes remembered (or the
--             run's version is behind the one expected: a failover lost writes);
--   'gone'    there is no such run.

local got = redis.call('HMGET', KEYS[1], 'version', 'writes')
if not got[1] then
  return {'gone', 0}
end
local version = tonumber(got[1])
local expected = tonumber(ARGV[1])
if version == expected then
  redis.call('HSET', KEYS[1], 'writes', remember_write(got[2], false))
  return {'fenced', redis.call('HINCRBY', KEYS[1], 'version', 1)}
end
if ARGV[3] == '1' then
  redis.call('SET', KEYS[2], 1, 'PX', 10000)
end
local writes = got[2] or ''
local kept = math.floor(#writes / WRITE_ID_LEN)
-- The remembered writes made versions version - kept + 1 .. version, oldest first.
local index = (expected + 1) - (version - kept + 1)
if version < expected or index < 0 then
  return {'unknown', version}
end
local made_it = string.sub(writes, index * WRITE_ID_LEN + 1, (index + 1) * WRITE_ID_LEN)
if made_it == ARGV[2] then
  return {'done', version}
end
return {'passed', version}
