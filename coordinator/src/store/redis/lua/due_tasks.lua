#!lua flags=no-writes
-- due_tasks: the tasks of one agent whose timers are due, earliest first, from one timer set.
-- KEYS: 1 the agent's timer set (on a cluster: the set of one slot, see timers.rs).
-- ARGV: 1 now (ms), 2 limit, 3 run key prefix (`P:run:`).
-- Replies with three values: the score of the set's earliest timer ('' when the set is empty;
-- a cluster's sweep files it in the slot registry); a flat list member, score, task bytes,
-- member, score, task bytes, ...; and the members of due timers whose task is gone (it cannot
-- happen through the scripts, but a hand edit can do it), which the caller removes.
--
-- It only reads (`no-writes`): a sweep runs every few milliseconds on the connection every
-- other command of the coordinator shares, and Redis holds a script that may write for as long
-- as writes are paused (`CLIENT PAUSE WRITE`, as in a failover), and every command behind it.
-- The run's tasks hash is not among KEYS; it carries the run's hash tag, which on a cluster is
-- the slot of the timer set.

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local found = {}
local gone = {}
for d = 1, #due, 2 do
  local member = due[d]
  local slash = string.find(member, '/', 1, true)
  local task = nil
  if slash then
    local run_id = string.sub(member, 1, slash - 1)
    local key = string.sub(member, slash + 1)
    task = redis.call('HGET', ARGV[3] .. '{' .. run_id .. '}:tasks', key)
  end
  if task then
    found[#found + 1] = member
    found[#found + 1] = due[d + 1]
    found[#found + 1] = task
  else
    gone[#gone + 1] = member
  end
end
local earliest = ''
local first = redis.call('ZRANGE', KEYS[1], 0, #gone, 'WITHSCORES')
local skipped = {}
for _, member in ipairs(gone) do
  skipped[member] = true
end
for f = 1, #first, 2 do
  if not skipped[first[f]] then
    earliest = first[f + 1]
    break
  end
end
return { earliest, found, gone }
