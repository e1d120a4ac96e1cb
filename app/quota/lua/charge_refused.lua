-- Count a request refused after it was read (a 400) as one request against each subject's
-- requests per minute, up to the limit: a full bucket stays full, never fuller.
-- KEYS: the requests buckets of the subjects with a limit. ARGV: their limits, in order.
-- Returns how many buckets were charged.
local now = now_us()
for i, key in ipairs(KEYS) do
  local rpm = tonumber(ARGV[i])
  local level, drained = bucket_load(key, rpm, now)
  bucket_store(key, rpm, math.min(level + 1, math.max(level, rpm)), drained, now)
end
return #KEYS
