-- append_output: appends pieces of live output to a running run's output stream, or nothing.
-- KEYS: 1 run header hash, 2 live output stream (both with the run's hash tag).
-- ARGV: 1 the most text the stream keeps (bytes), then per piece 6 values: step id, visit,
--   attempt, text, restart ("1" or "0"), the worker that streamed it (empty when unknown).
-- Only while the run's status is `running` (the transition that ends a run deletes its
-- output, and a late piece must not bring it back). The header's `output_bytes` counts the
-- text the stream holds; when it passes the limit the oldest pieces go. Replies with the number
-- of pieces appended.

if redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
local limit = tonumber(ARGV[1])
local bytes = tonumber(redis.call('HGET', KEYS[1], 'output_bytes') or '0')
local appended = 0
for i = 2, #ARGV, 6 do
  redis.call('XADD', KEYS[2], '*', 's', ARGV[i], 'v', ARGV[i + 1], 'a', ARGV[i + 2],
    't', ARGV[i + 3], 'r', ARGV[i + 4], 'w', ARGV[i + 5])
  bytes = bytes + #ARGV[i + 3]
  appended = appended + 1
end
while bytes > limit do
  local oldest = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
  if not oldest then
    bytes = 0
    break
  end
  local fields = oldest[2]
  for j = 1, #fields, 2 do
    if fields[j] == 't' then
      bytes = bytes - #fields[j + 1]
    end
  end
  redis.call('XDEL', KEYS[2], oldest[1])
end
redis.call('HSET', KEYS[1], 'output_bytes', bytes)
return appended
