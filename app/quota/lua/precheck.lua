#!lua flags=no-writes
-- Would a request of ARGV[1] tokens be refused now? Reads only: it runs before the
-- request's size is known, and reserve.lua (the same check, then the charge) follows.
-- Per subject i, from k = 4 * (i - 1): KEYS[k+1..k+4] as in reserve.lua; from
-- a = 1 + 5 * (i - 1): ARGV[a+1..a+5] as in reserve.lua.
-- Returns JSON: {levels} or {violations, levels}.
local n = #KEYS / 4
local _, violations, levels = check_subjects(n, 0, 1, tonumber(ARGV[1]), now_us())
if #violations > 0 then
  return cjson.encode({violations = violations, levels = levels})
end
return cjson.encode({levels = levels})
