-- due_tasks: the tasks of one agent whose timers are due, earliest first, from one timer set.
-- KEYS: 1 the agent's timer set (on a cluster: the set of one slot, see timers.rs).
-- ARGV: 1 now (ms), 2 limit, 3 run key prefix (`P:run:`).
-- Replies with a flat list: first the score of the set's earliest timer after the read ('' when
-- the set is empty; a cluster's sweep files it in the slot registry), then member, score, task
-- bytes, member, score, task bytes, ... A timer whose task is gone (it cannot happen through the
-- scripts, but a hand edit can do it) is removed on the way.

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[2])
local reply = { '' }
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
    reply[#reply + 1] = member
    reply[#reply + 1] = due[d + 1]
    reply[#reply + 1] = task
  else
    redis.call('ZREM', KEYS[1], member)
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then
  reply[1] = first[2]
end
return reply
