-- Extend one reservation's own leases; an expired or released lease is not revived.
-- KEYS: the lease sets of its subjects with a concurrency limit. ARGV: id, lease_us.
-- Returns how many leases were live and extended.
local id = ARGV[1]
local now = now_us()
local until_us = fmt(now + tonumber(ARGV[2]))
local held = 0
for _, key in ipairs(KEYS) do
  local score = redis.call('ZSCORE', key, id)
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', until_us, id)
    leases_expire(key)
    held = held + 1
  end
end
return held
