-- One exchange between an instance and a bucket's pool: refill exactly up to each expired
-- lease's reclaim time and reclaim it, refill to now, settle returned leases, credit, and
-- grant a lease (or replay the grant recorded
-- for the same request id), then further grants in the same call. The clock prologue and
-- the shared refill fragment before this body define `now` (µs) and `refill`.
--
-- KEYS[1] state hash {u, ts, rem, out, ep}; KEYS[2] lease hash id -> granted tokens;
-- KEYS[3] sorted set of lease ids by reclaim time (µs); KEYS[4] sorted set of the credit
-- ids applied, by the time each was applied (µs), kept for the credit window.
-- ARGV: 1 capacity (units, 10^6 per token), 2 rate (milli-tokens/s), 3 loose (0|1),
--       4 start full (0|1), 5 lease lifetime on Redis (µs), 6 key keep (ms),
--       7 request id ('' = no grant), 8 need (tokens), 9 want (tokens), 10 credit (units),
--       11 credit id (a credit whose id was applied within the window is not applied
--       again; '' = no id), 12 settle count n, then n pairs: lease id, unspent tokens; then a register count m
--       and m pairs: lease id, tokens (leases a holder re-registers after the state was
--       lost: they enter `out` and leave the balance, down to zero); then a count p and
--       p further lease ids, each granted up to `want` tokens (at least 1) after the first
--       grant, or replayed, when the first was granted or replayed.
-- Every key written gets an expiry (see the end).
-- Reply: {status, granted, exp_or_retry, u, out, ep, now, then per further id: granted,
--        reclaim time (0, 0 when none)}; status 1 granted, 2 replayed, 0 rejected (writes
--        nothing unless the key was created or a lease settled), 3 no grant asked.
local UNIT = 1000000
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local loose = ARGV[3] == '1'
local lease_us = tonumber(ARGV[5])
local keep_ms = tonumber(ARGV[6])
local req = ARGV[7]
local need = tonumber(ARGV[8])
local want = tonumber(ARGV[9])
local credit = tonumber(ARGV[10])
local cid = ARGV[11]
local nsettle = tonumber(ARGV[12])
-- How long a credit id is remembered: a retried credit older than this is not sent.
local credit_window = 8 * lease_us
if credit_window < 60000000 then credit_window = 60000000 end
if req ~= '' and need < 1 then need = 1 end

-- HMGET of many fields in chunks (Lua's unpack has a stack limit); a missing one is false.
local function hmget(key, ids)
  local got = {}
  for i = 1, #ids, 256 do
    local part = redis.call('HMGET', key, unpack(ids, i, math.min(i + 255, #ids)))
    for j = 1, #part do got[i + j - 1] = part[j] end
  end
  return got
end

local st = redis.call('HMGET', KEYS[1], 'u', 'ts', 'rem', 'out', 'ep')
local u, ts, rem, out, ep
local write = false
if not st[2] then
  if ARGV[4] == '1' then u = cap else u = 0 end
  ts = now; rem = 0; out = 0; ep = now; write = true
else
  u = tonumber(st[1]); ts = tonumber(st[2]); rem = tonumber(st[3])
  out = tonumber(st[4]); ep = tonumber(st[5])
end

-- Refill, then reclaim: the time since `ts` is refilled under the cap in force over it.
-- Up to each expired lease's reclaim time the cap is `B - out` with that lease still out;
-- the lease then leaves `out` (nothing is credited back: its holder may have spent it)
-- and the refill goes on under the raised cap. Settlements below happen at `now`, after
-- the whole refill: refilling after them would credit the time the balance spent at its
-- old cap as if the cap had been raised all along.
local function cap_now()
  if loose then return cap end
  local l = cap - out * UNIT
  if l < 0 then l = 0 end
  return l
end
local gone = {}
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'WITHSCORES', 'LIMIT', 0, 64)
local expired_ids = {}
for i = 1, #expired, 2 do expired_ids[#expired_ids + 1] = expired[i] end
local expired_g = hmget(KEYS[2], expired_ids)
for i, id in ipairs(expired_ids) do
  u, ts, rem = refill(u, ts, rem, cap_now(), rate, tonumber(expired[2 * i]))
  out = out - tonumber(expired_g[i] or '0')
  gone[id] = true
end
u, ts, rem = refill(u, ts, rem, cap_now(), rate, now)

-- Settle: the unspent part of a live lease comes back, the spent part is gone.
local settle_ids = {}
for i = 0, nsettle - 1 do settle_ids[i + 1] = ARGV[13 + 2 * i] end
local settle_g = hmget(KEYS[2], settle_ids)
for i = 0, nsettle - 1 do
  local id = settle_ids[i + 1]
  local back = tonumber(ARGV[14 + 2 * i])
  if not gone[id] then
    local g = settle_g[i + 1]
    if g then
      g = tonumber(g)
      if back > g then back = g end
      out = out - g
      u = u + back * UNIT
      gone[id] = true
      write = true
    end
  end
end
-- Register: leases this bucket's state lost (a restart) that a holder still spends.
local base = 14 + 2 * nsettle
local nreg = tonumber(ARGV[base - 1])
for i = 0, nreg - 1 do
  local id = ARGV[base + 2 * i]
  local g = tonumber(ARGV[base + 1 + 2 * i])
  if g > 0 and not gone[id] and not redis.call('HGET', KEYS[2], id) then
    redis.call('HSET', KEYS[2], id, g)
    redis.call('ZADD', KEYS[3], now + lease_us, id)
    out = out + g
    u = u - g * UNIT
    if u < 0 then u = 0; rem = 0 end
    write = true
  end
end
local limit = cap_now()
if u > limit then u = limit; rem = 0 end

-- Credit, at most once per id.
if credit > 0 and not (cid ~= '' and redis.call('ZSCORE', KEYS[4], cid)) then
  u = u + credit
  if u >= limit then u = limit; rem = 0 end
  write = true
  if cid ~= '' then
    redis.call('ZADD', KEYS[4], now, cid)
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - credit_window)
    redis.call('PEXPIRE', KEYS[4], math.floor(credit_window / 1000))
  end
end

-- Leases granted by this call: written together at the end (one HSET, one ZADD).
local fresh, fresh_ids = {}, {}
local function grant(id, g, at)
  fresh[id] = {g, at}
  fresh_ids[#fresh_ids + 1] = id
  u = u - g * UNIT; out = out + g
  write = true
end

local status, granted, third = 3, 0, 0
if req ~= '' then
  local prev = nil
  if not gone[req] then prev = redis.call('HGET', KEYS[2], req) end
  if gone[req] then
    status = 2
  elseif prev then
    status = 2; granted = tonumber(prev)
    third = tonumber(redis.call('ZSCORE', KEYS[3], req))
  elseif u >= need * UNIT then
    local g = math.floor(u / UNIT)
    if g > want then g = want end
    if g < need then g = need end
    status = 1; granted = g; third = now + lease_us
    grant(req, g, third)
  else
    status = 0
    if need * UNIT > limit then
      local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
      if need * UNIT <= cap and first[2] then
        third = tonumber(first[2]) - now
        if third < 1 then third = 1 end
      else
        third = -1
      end
    else
      local short = (need * UNIT - u) * 1000 - rem
      third = math.floor((short + rate - 1) / rate)
    end
  end
end

local more = {}
local pbase = base + 2 * nreg
local nmore = tonumber(ARGV[pbase])
if nmore > 0 then
  local more_ids = {}
  for i = 1, nmore do more_ids[i] = ARGV[pbase + i] end
  local paid = status == 1 or status == 2
  local prevs = {}
  if paid then prevs = hmget(KEYS[2], more_ids) end
  for i = 1, nmore do
    local id = more_ids[i]
    local g, at = 0, 0
    if paid and not gone[id] then
      if fresh[id] then
        g = fresh[id][1]; at = fresh[id][2]
      elseif prevs[i] then
        g = tonumber(prevs[i]); at = tonumber(redis.call('ZSCORE', KEYS[3], id))
      elseif u >= UNIT then
        g = math.floor(u / UNIT)
        if g > want then g = want end
        if g < 1 then g = 1 end
        at = now + lease_us
        grant(id, g, at)
      end
    end
    more[#more + 1] = g
    more[#more + 1] = at
  end
end

if write then
  local ids = {}
  for id, _ in pairs(gone) do ids[#ids + 1] = id end
  for i = 1, #ids, 256 do
    local chunk = {unpack(ids, i, math.min(i + 255, #ids))}
    redis.call('HDEL', KEYS[2], unpack(chunk))
    redis.call('ZREM', KEYS[3], unpack(chunk))
  end
  for i = 1, #fresh_ids, 256 do
    local h, z = {}, {}
    for j = i, math.min(i + 255, #fresh_ids) do
      local id = fresh_ids[j]
      h[#h + 1] = id; h[#h + 1] = fresh[id][1]
      z[#z + 1] = fresh[id][2]; z[#z + 1] = id
    end
    redis.call('HSET', KEYS[2], unpack(h))
    redis.call('ZADD', KEYS[3], unpack(z))
  end
  redis.call('HSET', KEYS[1], 'u', u, 'ts', ts, 'rem', rem, 'out', out, 'ep', ep)
  -- Every key expires once the bucket would be full with nothing out: after the last
  -- lease's reclaim time plus the time to refill from `u` (the refill may stall at
  -- `B - out` until then), plus the keep margin. Recreated then, full with nothing out,
  -- it is the same state.
  local last = now
  if out > 0 then
    local z = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    if z[2] and tonumber(z[2]) > last then last = tonumber(z[2]) end
  end
  local to_full = math.floor(((cap - u) * 1000 - rem + rate - 1) / rate)
  if to_full < 0 then to_full = 0 end
  local ttl = math.floor((last - now + to_full + 999) / 1000) + keep_ms
  redis.call('PEXPIRE', KEYS[1], ttl)
  if out > 0 then
    redis.call('PEXPIRE', KEYS[2], ttl)
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
end
local reply = {status, granted, third, u, out, ep, now}
for i = 1, #more do reply[7 + i] = more[i] end
return reply
