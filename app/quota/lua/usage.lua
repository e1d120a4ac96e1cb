-- Read one subject's consumption; changes nothing.
-- KEYS: requests bucket, tokens bucket, lease set, budget key prefix.
-- ARGV: rpm, tpm (0: unset), budget period ('' unset).
-- Returns JSON {requests, tokens, concurrent, budget_used, period}.
local now = now_us()
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local out = {concurrent = redis.call('ZCOUNT', KEYS[3], '(' .. fmt(now), '+inf')}
if rpm > 0 then
  out.requests = bucket_load(KEYS[1], rpm, now)
end
if tpm > 0 then
  out.tokens = bucket_load(KEYS[2], tpm, now)
end
if ARGV[3] ~= '' then
  out.period = period_id(ARGV[3], now)
  out.budget_used = tonumber(redis.call('GET', KEYS[4] .. out.period) or '0')
end
return cjson.encode(out)
