-- Undo one reserve attempt whose reply was lost, if it charged: the request counted, the
-- tokens, the leases, the budget. Then mark the id void for a while, so that the attempt, were
-- it still in transit, finds the id taken and charges nothing when it lands.
-- KEYS[1]: the reservation's record, KEYS[2]: its id's void mark. Per subject i, from
--   k = 2 + 4 * (i - 1): KEYS[k+1..k+4] as in reserve.lua.
-- ARGV: id, attempt, tokens, void_mark_ms; per subject, from a = 4 + 5 * (i - 1):
--   ARGV[a+1..a+5] as in reserve.lua (the limits the attempt was checked against).
-- Returns 1 if it undid the attempt's charges, 0 if there were none (it never ran, it was
-- refused, it was voided already, or the id holds another attempt's reservation).
local id = ARGV[1]
local attempt = ARGV[2]
local cost = tonumber(ARGV[3])
local n = (#KEYS - 2) / 4

local stored = redis.call('GET', KEYS[1])
if not stored then
  redis.call('SET', KEYS[2], attempt, 'PX', ARGV[4])
  return 0
end
local decoded, record = pcall(cjson.decode, stored)
if not decoded or type(record) ~= 'table' or record.a ~= attempt then
  return 0
end

local now = now_us()
local reserved_at = tonumber(record.at)
for i = 1, n do
  local k = 2 + 4 * (i - 1)
  local a = 4 + 5 * (i - 1)
  local rpm = tonumber(ARGV[a + 1])
  local tpm = tonumber(ARGV[a + 2])
  if rpm > 0 then
    bucket_refund(KEYS[k + 1], rpm, 1, reserved_at, now)
  end
  if tpm > 0 then
    bucket_refund(KEYS[k + 2], tpm, cost, reserved_at, now)
  end
  redis.call('ZREM', KEYS[k + 3], id)
  if record.p[i] ~= '' then
    budget_add(KEYS[k + 4] .. record.p[i], -cost)
  end
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], attempt, 'PX', ARGV[4])
return 1
