-- Shared by every quota script (prepended to each): Redis time, GCRA buckets, budget periods.
-- Mirrors app/quota/bucket.py and app.quota.limits.period_id; keep them in step.

local MINUTE_US = 60000000
local EPSILON = 1e-9

-- The one clock every replica agrees on, in integer microseconds (exact in a double).
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- tostring() keeps 14 digits, too few for microsecond timestamps.
local function fmt(x)
  return string.format('%.17g', x)
end

-- A bucket's level at `now` and when it was last seen empty (GCRA in leaky-bucket form).
local function bucket_load(key, limit, now)
  local v = redis.call('HMGET', key, 'l', 't', 'd')
  if not v[1] then
    return 0, now
  end
  local level = tonumber(v[1]) - math.max(0, now - tonumber(v[2])) * limit / MINUTE_US
  if level <= EPSILON then
    return 0, now
  end
  return level, tonumber(v[3])
end

-- Kept until it has drained, plus a second.
local function bucket_store(key, limit, level, drained, now)
  redis.call('HSET', key, 'l', fmt(level), 't', fmt(now), 'd', fmt(drained))
  redis.call('PEXPIRE', key, math.ceil(level * MINUTE_US / limit / 1000) + 1000)
end

-- Take `amount` charged at `since` back out of a bucket, unless the bucket has emptied since:
-- the charge has then drained away already.
local function bucket_refund(key, limit, amount, since, now)
  local level, drained = bucket_load(key, limit, now)
  if drained <= since then
    level = math.max(0, level - amount)
    if level == 0 then
      drained = now
    end
    bucket_store(key, limit, level, drained, now)
  end
end

-- How long until `cost` fits under `limit` at `level`, in seconds; 0 when it fits now.
local function wait_seconds(level, cost, limit)
  local excess = level + cost - limit
  if excess <= EPSILON then
    return 0
  end
  return excess * 60 / limit
end

-- The lease set outlives its last lease by a second.
local function leases_expire(key)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[2] then
    redis.call('PEXPIREAT', key, math.ceil(tonumber(top[2]) / 1000) + 1000)
  end
end

-- Howard Hinnant's civil_from_days: the proleptic Gregorian date of a day since 1970-01-01.
local function civil_from_days(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then
    y = y + 1
  end
  return y, m, d
end

-- The UTC calendar period holding `now`: 2025-01-31 for 'day', 2025-01 for 'month'.
local function period_id(period, now)
  local y, m, d = civil_from_days(math.floor(math.floor(now / 1000000) / 86400))
  if period == 'day' then
    return string.format('%04d-%02d-%02d', y, m, d)
  end
  return string.format('%04d-%02d', y, m)
end

-- A budget count outlives its period (and the reconcile window) before it expires.
local BUDGET_TTL_S = {day = 2 * 86400, month = 32 * 86400}

-- Add `delta` (negative: a refund) to a budget count, never below 0. A count that has expired
-- belongs to a period long over, and is not revived.
local function budget_add(key, delta)
  if redis.call('EXISTS', key) == 1 then
    if redis.call('INCRBY', key, delta) < 0 then
      redis.call('SET', key, '0', 'KEEPTTL')
    end
  end
end

-- Check `n` subjects against a request of `cost` tokens; changes nothing (reserve.lua and
-- precheck.lua share it, so both refuse alike). Per subject i, KEYS[k+1..k+4] from
-- k = key_base + 4 * (i - 1): requests bucket, tokens bucket, lease set, budget key prefix
-- (the period id is appended); ARGV[a+1..a+5] from a = arg_base + 5 * (i - 1): rpm, tpm,
-- max concurrent, budget (0: unset), budget period ('' unset).
-- Returns the subjects as found, the violations {i, limit, wait or null, used} and the
-- levels {rpm, tpm} (null where unset).
local function check_subjects(n, key_base, arg_base, cost, now)
  local subjects = {}
  local violations = {}
  local levels = {}
  for i = 1, n do
    local k = key_base + 4 * (i - 1)
    local a = arg_base + 5 * (i - 1)
    local s = {
      rpm = tonumber(ARGV[a + 1]), tpm = tonumber(ARGV[a + 2]), conc = tonumber(ARGV[a + 3]),
      budget = tonumber(ARGV[a + 4]), period = ARGV[a + 5],
      rkey = KEYS[k + 1], tkey = KEYS[k + 2], ckey = KEYS[k + 3], period_id = '',
    }
    local level = {cjson.null, cjson.null}
    if s.rpm > 0 then
      s.r, s.rd = bucket_load(s.rkey, s.rpm, now)
      level[1] = s.r
      local wait = wait_seconds(s.r, 1, s.rpm)
      if wait > 0 then
        table.insert(violations, {i, 'requests', wait, s.r})
      end
    end
    if s.tpm > 0 then
      s.t, s.td = bucket_load(s.tkey, s.tpm, now)
      level[2] = s.t
      local wait = wait_seconds(s.t, cost, s.tpm)
      if wait > 0 then
        table.insert(violations, {i, 'tokens', wait, s.t})
      end
    end
    if s.conc > 0 then
      -- Live leases only: an expired one has a score at or before now.
      local live = redis.call('ZCOUNT', s.ckey, '(' .. fmt(now), '+inf')
      if live >= s.conc then
        table.insert(violations, {i, 'concurrent', cjson.null, live})
      end
    end
    if s.budget > 0 then
      s.period_id = period_id(s.period, now)
      s.bkey = KEYS[k + 4] .. s.period_id
      s.used = tonumber(redis.call('GET', s.bkey) or '0')
      if s.used + cost > s.budget then
        table.insert(violations, {i, 'budget', cjson.null, s.used})
      end
    end
    subjects[i] = s
    levels[i] = level
  end
  return subjects, violations, levels
end
