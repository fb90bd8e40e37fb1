-- Per-request strict mode: take `cost` from every bucket named in KEYS, all or nothing,
-- with no lease. The clock prologue and the shared refill fragment before this body
-- define `now` (µs) and `refill`.
--
-- KEYS: the buckets' state hashes (one hash tag, so a cluster keeps them in one slot).
-- ARGV: per key i, ARGV[4i-3..4i] = capacity (units), rate (milli-tokens/s), start full
--       (0|1), cost (tokens); then key keep (ms).
-- Reply: {1, balance_1, ..., balance_n} when every bucket paid; {0, i, retry_us} naming the
--        first bucket that cannot pay (retry_us = -1 when its capacity is below the cost);
--        a refusal writes nothing but the creation of missing keys. Every key written
--        expires at its time to full plus the key keep (a key holding leases keeps the
--        expiry its exchange set), so refusals leave no key behind for good.
local UNIT = 1000000
local n = #KEYS
local keep_ms = tonumber(ARGV[4 * n + 1])
local st = {}
local created = {}
-- Sets a written key's expiry: its time to full plus the keep, unless leases are out.
local function expire(key, u, rem, out, cap, rate)
  if out == 0 then
    local to_full = math.floor(((cap - u) * 1000 - rem + rate - 1) / rate)
    redis.call('PEXPIRE', key, math.floor((to_full + 999) / 1000) + keep_ms)
  end
end
for i = 1, n do
  local cap = tonumber(ARGV[4 * i - 3])
  local rate = tonumber(ARGV[4 * i - 2])
  local cost = tonumber(ARGV[4 * i]) * UNIT
  local h = redis.call('HMGET', KEYS[i], 'u', 'ts', 'rem', 'out', 'ep')
  local u, ts, rem, out, ep
  if not h[2] then
    if ARGV[4 * i - 1] == '1' then u = cap else u = 0 end
    ts = now; rem = 0; out = 0; ep = now
    created[#created + 1] = {i, u, cap, rate}
  else
    u = tonumber(h[1]); ts = tonumber(h[2]); rem = tonumber(h[3])
    out = tonumber(h[4]); ep = tonumber(h[5])
  end
  local limit = cap - out * UNIT
  if limit < 0 then limit = 0 end
  u, ts, rem = refill(u, ts, rem, limit, rate, now)
  if u < cost then
    -- Refused: only the keys created here are written (so an empty-start bucket refused
    -- from its creation on still refills from then).
    for _, c in ipairs(created) do
      redis.call('HSET', KEYS[c[1]], 'u', c[2], 'ts', now, 'rem', 0, 'out', 0, 'ep', now)
      expire(KEYS[c[1]], c[2], 0, 0, c[3], c[4])
    end
    if cost > limit then return {0, i, -1} end
    return {0, i, math.floor(((cost - u) * 1000 - rem + rate - 1) / rate)}
  end
  st[i] = {u - cost, ts, rem, out, ep, cap, rate}
end
local reply = {1}
for i = 1, n do
  local s = st[i]
  redis.call('HSET', KEYS[i], 'u', s[1], 'ts', s[2], 'rem', s[3], 'out', s[4], 'ep', s[5])
  expire(KEYS[i], s[1], s[3], s[4], s[6], s[7])
  reply[i + 1] = s[1]
end
return reply
