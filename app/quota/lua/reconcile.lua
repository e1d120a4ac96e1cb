-- Settle a reservation: free its leases and, the first time only, move its tokens-per-minute
-- and budget charges from the reserved to the actual tokens.
-- KEYS[1]: the reservation's record. Per subject i, from k = 1 + 3 * (i - 1):
--   KEYS[k+1] tokens bucket, KEYS[k+2] lease set, KEYS[k+3] budget key ('' without one).
-- ARGV: id, reserved tokens, actual tokens, reserved_at_us; per subject ARGV[4 + i] = tpm (0).
-- Returns 1 if this call settled the reservation, 0 if it had been already.
local id = ARGV[1]
local delta = tonumber(ARGV[3]) - tonumber(ARGV[2])
local reserved_at = tonumber(ARGV[4])
local n = (#KEYS - 1) / 3

for i = 1, n do
  redis.call('ZREM', KEYS[1 + 3 * (i - 1) + 2], id)
end
if redis.call('DEL', KEYS[1]) == 0 then
  return 0
end
if delta == 0 then
  return 1
end

local now = now_us()
for i = 1, n do
  local k = 1 + 3 * (i - 1)
  local tpm = tonumber(ARGV[4 + i])
  if tpm > 0 then
    if delta > 0 then
      local level, drained = bucket_load(KEYS[k + 1], tpm, now)
      bucket_store(KEYS[k + 1], tpm, level + delta, drained, now)
    else
      bucket_refund(KEYS[k + 1], tpm, -delta, reserved_at, now)
    end
  end
  if KEYS[k + 3] ~= '' then
    budget_add(KEYS[k + 3], delta)
  end
end
return 1
