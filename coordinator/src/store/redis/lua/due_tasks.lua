-- due_tasks: the tasks of one agent whose timers are due, earliest first.
-- KEYS: 1 the agent's timer set. ARGV: 1 now (ms), 2 limit, 3 run key prefix (`P:run:`).
-- Replies with a flat list: member, task bytes, member, task bytes, ... A timer whose task is
-- gone (it cannot happen through the scripts, but a hand edit can do it) is removed on the way.

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local reply = {}
for _, member in ipairs(due) do
  local slash = string.find(member, '/', 1, true)
  local task = nil
  if slash then
    local run_id = string.sub(member, 1, slash - 1)
    local key = string.sub(member, slash + 1)
    task = redis.call('HGET', ARGV[3] .. '{' .. run_id .. '}:tasks', key)
  end
  if task then
    reply[#reply + 1] = member
    reply[#reply + 1] = task
  else
    redis.call('ZREM', KEYS[1], member)
  end
end
return reply
