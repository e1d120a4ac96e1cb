-- Admit a request against every limit of every subject, or charge nothing.
-- KEYS[1]: the reservation's record, KEYS[2]: its id's void mark. Per subject i, from
-- k = 2 + 4 * (i - 1): KEYS[k+1] requests bucket, KEYS[k+2] tokens bucket, KEYS[k+3] lease set,
--   KEYS[k+4] budget key prefix (the period id is appended).
-- ARGV: id, attempt, tokens, lease_us, record_ttl_ms; per subject, from a = 5 + 5 * (i - 1):
--   ARGV[a+1..a+5] = rpm, tpm, max concurrent, budget (0: unset), budget period ('' unset).
-- The record keeps what void.lua needs to undo this attempt should its reply be lost.
-- Returns JSON: {ok, now, periods, levels} or {violations, levels}; levels are [rpm, tpm];
-- {duplicate} when the id is in use, or was voided (this attempt then lands too late).
local id = ARGV[1]
local attempt = ARGV[2]
local cost = tonumber(ARGV[3])
local lease_us = tonumber(ARGV[4])
local record_ttl_ms = tonumber(ARGV[5])
local n = (#KEYS - 2) / 4
local now = now_us()

if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then
  return cjson.encode({duplicate = true})
end

local subjects, violations, levels = check_subjects(n, 2, 5, cost, now)
if #violations > 0 then
  return cjson.encode({violations = violations, levels = levels})
end

local periods = {}
for i = 1, n do
  local s = subjects[i]
  if s.rpm > 0 then
    bucket_store(s.rkey, s.rpm, s.r + 1, s.rd, now)
    levels[i][1] = s.r + 1
  end
  if s.tpm > 0 then
    bucket_store(s.tkey, s.tpm, s.t + cost, s.td, now)
    levels[i][2] = s.t + cost
  end
  if s.conc > 0 then
    redis.call('ZREMRANGEBYSCORE', s.ckey, '-inf', fmt(now))
    redis.call('ZADD', s.ckey, fmt(now + lease_us), id)
    leases_expire(s.ckey)
  end
  if s.budget > 0 then
    redis.call('INCRBY', s.bkey, cost)
    redis.call('EXPIRE', s.bkey, BUDGET_TTL_S[s.period])
  end
  periods[i] = s.period_id
end
local record = cjson.encode({a = attempt, at = fmt(now), p = periods})
redis.call('SET', KEYS[1], record, 'PX', record_ttl_ms)
return cjson.encode({ok = true, now = fmt(now), periods = periods, levels = levels})
