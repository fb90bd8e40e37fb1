-- Rate leases: one instance's refresh of its share (r_i, b_i) of a fleet budget (B, r),
-- divided max-min fairly among the reported demands of every live instance. The clock
-- prologue before this body defines `now` (µs).
--
-- The cap: at every instant of the server's clock, the shares any instance may still
-- spend sum to at most r (rate) and B (burst). An instance may spend the share of its
-- latest grant (`cur`) and, until it has acknowledged that grant, the share it reported
-- spending when it asked (`hold`); each until its expiry. A grant is therefore clamped to
-- what every other instance's larger of `cur` and `hold` leaves, and a share taken from
-- one instance is given to another only once that instance acknowledged the smaller one
-- or its lease expired here (never earlier: its holder may spend it until then).
--
-- KEYS[1] state hash {ep, learn}; KEYS[2] hash instance id -> record
--   "seq cur_r cur_b cur_exp hold_seq hold_r hold_b hold_exp want" (rates in
--   milli-tokens/s, bursts in tokens, times in µs of this server's clock).
-- ARGV: 1 B (tokens), 2 r (milli-tokens/s), 3 lease lifetime on Redis (µs: ttl + grace),
--       4 minimum share (milli-tokens/s), 5 learn after a loss (0|1), 6 key keep (ms),
--       7 instance id, 8 request sequence number (increasing per instance), 9 the
--       sequence number of the grant the instance spends now (0: none), 10 the rate and
--       11 the burst it spends of that grant (at most the grant's: it may have shrunk
--       it locally), 12 the instance's demand (milli-tokens/s), 13 leave (0|1: give the
--       share back).
-- Reply: {status, r_i, b_i, expiry (µs), continuous (0|1), now, epoch, live instances,
--        fair target r (milli-tokens/s)}. Status 1 granted; 0 stale (a sequence number
--        not above the recorded one: nothing written). `continuous` = 1 when the share
--        the instance reported was still counted here, so it may carry its tokens over;
--        0: its bucket starts empty.
local B = tonumber(ARGV[1])
local R = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local minr = tonumber(ARGV[4])
local learn_on = ARGV[5] == '1'
local keep_ms = tonumber(ARGV[6])
local me_id = ARGV[7]
local seq = tonumber(ARGV[8])
local has_seq = tonumber(ARGV[9])
local has_r = tonumber(ARGV[10])
local has_b = tonumber(ARGV[11])
local want = tonumber(ARGV[12])
local leave = ARGV[13] == '1'

local st = redis.call('HMGET', KEYS[1], 'ep', 'learn')
local ep, learn
if not st[1] then
  -- New or lost (a restart without persistence). With learning on, grants held before
  -- the loss may live one lease lifetime more: until then nobody gets more than the
  -- share it reports spending (newcomers nothing), so the cap holds across the loss.
  ep = now; learn = 0
  if learn_on then learn = now + lease end
else
  ep = tonumber(st[1]); learn = tonumber(st[2])
end

local function parse(s)
  local t = {}
  for x in string.gmatch(s, '%S+') do t[#t + 1] = tonumber(x) end
  return t
end
local all = redis.call('HGETALL', KEYS[2])
local others, dead = {}, {}
local me = nil
for i = 1, #all, 2 do
  local f = parse(all[i + 1])
  local rec = {seq = f[1], cr = f[2], cb = f[3], cexp = f[4], hseq = f[5], hr = f[6],
               hb = f[7], hexp = f[8], want = f[9]}
  if all[i] == me_id then
    me = rec
  elseif rec.cexp <= now and rec.hexp <= now then
    dead[#dead + 1] = all[i]
  else
    others[#others + 1] = rec
  end
end
if me and seq <= me.seq then
  return {0, 0, 0, 0, 0, now, ep, 0, 0}
end

-- What an instance may spend now: the larger of its unexpired grant and hold.
local function held(rec)
  local r, b = 0, 0
  if rec.cexp > now then r = rec.cr; b = rec.cb end
  if rec.hexp > now then
    if rec.hr > r then r = rec.hr end
    if rec.hb > b then b = rec.hb end
  end
  return r, b
end
local used_r, used_b = 0, 0
for _, rec in ipairs(others) do
  local r, b = held(rec)
  used_r = used_r + r; used_b = used_b + b
end

-- The share the caller spends until it receives this reply: the grant it names, or less
-- where it reports less (an instance whose demand fell shrinks its share locally before
-- it asks, so the difference is free at once, with no acknowledgement).
local hseq, hr, hb, hexp, continuous = 0, 0, 0, 0, 0
if has_seq > 0 then
  if me and has_seq == me.seq and me.cexp > now then
    hseq, hr, hb, hexp, continuous = me.seq, math.min(me.cr, has_r), math.min(me.cb, has_b), me.cexp, 1
  elseif me and has_seq == me.hseq and me.hexp > now then
    hseq, hr, hb, hexp, continuous = me.hseq, math.min(me.hr, has_r), math.min(me.hb, has_b), me.hexp, 1
  elseif (has_r > 0 or has_b > 0) and not (me and has_seq <= me.seq) then
    -- A grant this state never saw (it was lost): counted from now for one lifetime.
    hseq, hr, hb, hexp, continuous = has_seq, math.min(has_r, R), math.min(has_b, B), now + lease, 1
  end
end

-- Max-min fair targets over the live instances' demands (each at least the minimum
-- share), dividing r less one minimum share kept free so a newcomer starts at once.
-- A target is what the caller gets once the others' larger holds are gone; the grant is
-- the part of it the others leave now.
local wants = {}
for _, rec in ipairs(others) do
  if rec.cexp > now then wants[#wants + 1] = math.max(rec.want, minr) end
end
local mywant = math.max(want, minr)
if leave then mywant = 0 end
wants[#wants + 1] = mywant
table.sort(wants)
local pool = R - minr
if pool < 0 then pool = 0 end
local target, level = mywant, nil
local rest, n = pool, #wants
for i, w in ipairs(wants) do
  local fair = math.floor(rest / (n - i + 1))
  if w > fair then level = fair; break end
  rest = rest - w
end
if level then
  if target > level then target = level end
else
  -- Every demand met: what is left is split evenly, so an idle fleet's buckets fill to
  -- its whole burst (a quiet fleet can burst B) until demand claims it.
  target = mywant + math.floor(rest / n)
end

local gr, gb = 0, 0
if not leave then
  local free_r, free_b = R - used_r, B - used_b
  gr = target
  if learn > now then gr = math.min(gr, hr) end
  if gr > free_r then gr = free_r end
  if gr < 0 then gr = 0 end
  gb = math.floor(B / R * gr)
  if gb < 1 and gr > 0 then gb = 1 end
  if learn > now and gb > hb then gb = hb end
  if gb > free_b then gb = free_b end
  if gb < 0 then gb = 0 end
  -- Within 1/32 of the current share, and room for it: the same share again (fewer
  -- changes of the local bucket).
  if me and me.cexp > now and learn <= now and math.abs(gr - me.cr) * 32 <= me.cr
      and me.cr <= free_r and me.cb <= free_b and me.cb >= 1 then
    gr, gb = me.cr, me.cb
  end
  if gr == 0 or gb == 0 then gr, gb = 0, 0 end
end

local exp = now + lease
redis.call('HSET', KEYS[2], me_id, string.format('%.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f',
  seq, gr, gb, exp, hseq, hr, hb, hexp, mywant))
for i = 1, #dead, 256 do
  redis.call('HDEL', KEYS[2], unpack(dead, i, math.min(i + 255, #dead)))
end
redis.call('HSET', KEYS[1], 'ep', ep, 'learn', learn)
-- Every record expires within one lifetime of its last grant: the keys outlive them all.
local ttl = math.floor((lease + 999) / 1000) + keep_ms
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
local live = 1
for _, rec in ipairs(others) do
  if rec.cexp > now then live = live + 1 end
end
return {1, gr, gb, exp, continuous, now, ep, live, target}
