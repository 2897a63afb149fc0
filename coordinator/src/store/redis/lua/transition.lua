-- Shared prelude of create_run.lua and apply_transition.lua (the Rust side concatenates this file
-- in front of each of them, so both scripts decode, check and write a transition the same way).
--
-- KEYS of both scripts: 1 run header hash, 2 events list, 3 results hash, 4 steps hash,
-- 5 tasks hash, 6 chain list, 7 decisions hash, 8 live output stream, all of them carrying the
-- run's hash tag.
--
-- A transition is encoded in ARGV from position `i` on (every value is a binary-safe string):
--   n_events, then n_events events (applied in that order),
--   n_results, then n_results pairs of (key, bytes),
--   n_steps, then n_steps pairs of (step id, bytes),
--   n_tasks_set, then n_tasks_set pairs of (task key, bytes),
--   n_tasks_removed, then n_tasks_removed task keys,
--   n_links, then n_links state chain links,
--   n_decisions, then n_decisions pairs of (decision key, bytes),
--   status, has_error ("1" or "0"), error (empty when has_error is "0"), state_sha256, updated_ms,
--   timer prefix (`P:timers:`), run id, write id (WRITE_ID_LEN characters, or empty),
--   n_fences, then n_fences pairs of (task key, attempt).
--
-- Tasks are JSON objects. Each one with an `agent` and a `due_ms` has a timer: its member
-- `<run id>/<task key>` in the sorted set `<timer prefix><agent>`, scored `due_ms`. Setting a
-- task moves its timer, removing it removes the timer, so the two never disagree. A fence
-- `(key, attempt)` makes the transition apply only while that task exists at that attempt.
--
-- Redis does not roll a script back when it fails half-way, so every check runs before the first
-- write, and a script that returns an error has written nothing.

local function read_pairs(i)
  local n = tonumber(ARGV[i])
  local list = {}
  for j = 1, n do
    list[j] = { ARGV[i + 2 * j - 1], ARGV[i + 2 * j] }
  end
  return list, i + 1 + 2 * n
end

local function read_transition(i)
  local t = {}
  local n_events = tonumber(ARGV[i])
  t.events = {}
  for j = 1, n_events do
    t.events[j] = ARGV[i + j]
  end
  t.results, i = read_pairs(i + 1 + n_events)
  t.steps, i = read_pairs(i)
  t.tasks_set, i = read_pairs(i)
  local n_removed = tonumber(ARGV[i])
  t.tasks_removed = {}
  for j = 1, n_removed do
    t.tasks_removed[j] = ARGV[i + j]
  end
  i = i + 1 + n_removed
  local n_links = tonumber(ARGV[i])
  t.links = {}
  for j = 1, n_links do
    t.links[j] = ARGV[i + j]
  end
  i = i + 1 + n_links
  t.decisions, i = read_pairs(i)
  t.status = ARGV[i]
  t.has_error = ARGV[i + 1] == '1'
  t.error = ARGV[i + 2]
  t.state_sha256 = ARGV[i + 3]
  t.updated_ms = ARGV[i + 4]
  t.timer_prefix = ARGV[i + 5]
  t.run_id = ARGV[i + 6]
  t.write_id = ARGV[i + 7]
  t.fences, i = read_pairs(i + 8)
  return t
end

-- The header's `writes` field names the writes that made the run's last versions, oldest first:
-- WRITES_KEPT ids of WRITE_ID_LEN characters end to end, one per version (a write of no id, and a
-- fence of settle_transition.lua, leave NO_WRITE_ID), so that a write whose answer was lost can
-- be found. Both lengths are the Rust side's (store/mod.rs).
local WRITE_ID_LEN = 16
local WRITES_KEPT = 8
local NO_WRITE_ID = string.rep('-', WRITE_ID_LEN)

-- `writes` (the field, or false) with `id` remembered as the newest.
local function remember_write(writes, id)
  if type(id) ~= 'string' or #id ~= WRITE_ID_LEN then
    id = NO_WRITE_ID
  end
  local kept = (writes or '') .. id
  if #kept > WRITE_ID_LEN * WRITES_KEPT then
    kept = string.sub(kept, -WRITE_ID_LEN * WRITES_KEPT)
  end
  return kept
end

local function decode_task(bytes)
  if not bytes then
    return nil
  end
  local ok, task = pcall(cjson.decode, bytes)
  if ok and type(task) == 'table' then
    return task
  end
  return nil
end

-- What the script has read or written of the run's tasks hash and of key types, so that each is
-- asked of Redis once per script (a task is fenced, checked and rewritten by one transition).
local task_bytes = {}
local key_types = {}

-- The task stored under `key` (its bytes, or false).
local function stored_task(key)
  local bytes = task_bytes[key]
  if bytes == nil then
    bytes = redis.call('HGET', KEYS[5], key)
    task_bytes[key] = bytes
  end
  return bytes
end

local function type_of(key)
  local kind = key_types[key]
  if kind == nil then
    kind = redis.call('TYPE', key)['ok']
    key_types[key] = kind
  end
  return kind
end

-- Removes the timer of a task as stored (`bytes`, or nothing).
local function unset_timer(prefix, member, bytes)
  local task = decode_task(bytes)
  if task and type(task.agent) == 'string' then
    redis.call('ZREM', prefix .. task.agent, member)
  end
end

-- Sets the timer of a task about to be stored as `bytes`.
local function set_timer(prefix, member, bytes)
  local task = decode_task(bytes)
  if task and type(task.agent) == 'string' and type(task.due_ms) == 'number'
      and task.due_ms == math.floor(task.due_ms) then
    redis.call('ZADD', prefix .. task.agent, string.format('%d', task.due_ms), member)
  end
end

-- A timer set of another type would make a write fail half-way: refuse it before writing.
local function check_timer_key(prefix, bytes)
  local task = decode_task(bytes)
  if task and type(task.agent) == 'string' then
    local kind = type_of(prefix .. task.agent)
    if kind ~= 'none' and kind ~= 'zset' then
      return redis.error_reply('CORRUPT key ' .. prefix .. task.agent .. ' is a ' .. kind .. ', not a zset')
    end
  end
  return nil
end

local function check_timer_types(t)
  for _, key in ipairs(t.tasks_removed) do
    local err = check_timer_key(t.timer_prefix, stored_task(key))
    if err then
      return err
    end
  end
  for _, pair in ipairs(t.tasks_set) do
    local err = check_timer_key(t.timer_prefix, stored_task(pair[1]))
      or check_timer_key(t.timer_prefix, pair[2])
    if err then
      return err
    end
  end
  return nil
end

-- A fenced transition is the answer to one attempt of a task: it applies only while that attempt
-- is the task's current one.
local function check_fences(t)
  for _, pair in ipairs(t.fences) do
    local task = decode_task(stored_task(pair[1]))
    local current = 'none'
    if task and type(task.attempt) == 'number' then
      current = string.format('%d', task.attempt)
    end
    if current ~= pair[2] then
      return redis.error_reply('FENCED ' .. pair[1] .. ' ' .. current)
    end
  end
  return nil
end

local KEY_TYPES = { 'hash', 'list', 'hash', 'hash', 'hash', 'list', 'hash', 'stream' }

-- Keys of another type would make a write fail half-way: refuse them before writing anything.
-- Only the keys this transition writes are asked about: the header was read already (a wrong
-- type fails that read, before any write), and the live output stream is only given an expiry,
-- which any type takes.
local function check_types(t)
  local written = {
    [2] = #t.events > 0,
    [3] = #t.results > 0,
    [4] = #t.steps > 0,
    [5] = #t.tasks_set + #t.tasks_removed > 0,
    [6] = #t.links > 0,
    [7] = #t.decisions > 0,
  }
  for k = 2, 7 do
    if written[k] then
      local kind = type_of(KEYS[k])
      if kind ~= 'none' and kind ~= KEY_TYPES[k] then
        return redis.error_reply('CORRUPT key ' .. KEYS[k] .. ' is a ' .. kind .. ', not a ' .. KEY_TYPES[k])
      end
    end
  end
  return nil
end

-- Results are written once: an existing key with other bytes is corruption, with the same bytes
-- a harmless retry.
local function check_results(t)
  for _, pair in ipairs(t.results) do
    local existing = redis.call('HGET', KEYS[3], pair[1])
    if existing and existing ~= pair[2] then
      return redis.error_reply('CORRUPT run already has a different result for ' .. pair[1])
    end
  end
  return nil
end

-- Writes a checked transition and returns the run's new version; `before_status` is the run's
-- status before it (false for a new run), `writes` its `writes` field (false for a new run).
local function write_transition(t, before_status, writes)
  for _, event in ipairs(t.events) do
    redis.call('RPUSH', KEYS[2], event)
  end
  for _, pair in ipairs(t.results) do
    redis.call('HSET', KEYS[3], pair[1], pair[2])
  end
  for _, pair in ipairs(t.steps) do
    redis.call('HSET', KEYS[4], pair[1], pair[2])
  end
  for _, key in ipairs(t.tasks_removed) do
    unset_timer(t.timer_prefix, t.run_id .. '/' .. key, stored_task(key))
    redis.call('HDEL', KEYS[5], key)
    task_bytes[key] = false
  end
  for _, pair in ipairs(t.tasks_set) do
    local member = t.run_id .. '/' .. pair[1]
    unset_timer(t.timer_prefix, member, stored_task(pair[1]))
    redis.call('HSET', KEYS[5], pair[1], pair[2])
    task_bytes[pair[1]] = pair[2]
    set_timer(t.timer_prefix, member, pair[2])
  end
  for _, link in ipairs(t.links) do
    redis.call('RPUSH', KEYS[6], link)
  end
  -- First write wins: a retried write may carry a recomputed embedding.
  for _, pair in ipairs(t.decisions) do
    redis.call('HSETNX', KEYS[7], pair[1], pair[2])
  end
  redis.call('HSET', KEYS[1], 'status', t.status, 'state_sha256', t.state_sha256, 'updated_ms', t.updated_ms,
    'writes', remember_write(writes, t.write_id))
  -- A run's live output takes no more pieces once it ends, and is kept a minute more for the
  -- watchers still reading it (OUTPUT_KEPT_AFTER_END on the Rust side).
  if t.status ~= 'running' then
    redis.call('PEXPIRE', KEYS[8], 60000)
  elseif before_status ~= 'running' then
    -- A redriven run runs again, and streams again.
    redis.call('PERSIST', KEYS[8])
  end
  if t.has_error then
    redis.call('HSET', KEYS[1], 'error', t.error)
  else
    redis.call('HDEL', KEYS[1], 'error')
  end
  return redis.call('HINCRBY', KEYS[1], 'version', 1)
end
