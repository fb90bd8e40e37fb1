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
-- Handing on dropped tokens: an instance whose share shrinks drops the tokens its bucket
-- can no longer hold (before it reports), and reports how many with an id. The script
-- credits them to a pool (`pool`, until `pexp`) once per id (the record keeps the last id
-- credited), at most by what the caller's counted burst shrank, and only for a share it
-- still counts. The pool's tokens keep their burst: grants are clamped so that the
-- bursts any instance may spend plus the pool never exceed B. A grant may take tokens
-- from the pool (taken here, before the reply: a lost reply loses them) for its bucket to
-- start with, when it wants more than it gets or the pool blocks its burst; what still
-- blocks the burst leaves the pool unspent (the pool never takes a newcomer's burst); so
-- the tokens all buckets hold plus the pool never exceed B.
--
-- Idle rate: each refresh records the rate no instance may spend (`free`, r less every
-- instance's larger of `cur` and `hold`), its time (`acc`) and the burst left (`pcap`, B
-- less those bursts). Until the next refresh only expiries change what is counted, so the
-- next one adds free * elapsed to the pool (carrying the fraction, `pfrac`), up to pcap:
-- the buckets refill at the shares' rates and the pool at the rest, r in all.
--
-- KEYS[1] state hash {ep, learn, pool, pexp, free, acc, pcap, pfrac}; KEYS[2] hash
--   instance id -> record
--   "seq cur_r cur_b cur_exp hold_seq hold_r hold_b hold_exp want drop_id" (rates in
--   milli-tokens/s, bursts in tokens, times in µs of this server's clock).
-- ARGV: 1 B (tokens), 2 r (milli-tokens/s), 3 lease lifetime on Redis (µs: ttl + grace),
--       4 minimum share (milli-tokens/s), 5 learn after a loss (0|1), 6 key keep (ms),
--       7 instance id, 8 request sequence number (increasing per instance), 9 the
--       sequence number of the grant the instance spends now (0: none), 10 the rate and
--       11 the burst it spends of that grant (at most the grant's: it may have shrunk
--       it locally), 12 the instance's demand (milli-tokens/s), 13 leave (0|1: give the
--       share back), 14 tokens dropped, 15 the drop's id (0: none; increasing per
--       instance), 16 the tokens the instance's bucket holds now (what a grant may add).
-- Reply: {status, r_i, b_i, expiry (µs), continuous (0|1), now, epoch, live instances,
--        fair target r (milli-tokens/s), tokens handed on from the pool}. Status 1
--        granted; 0 stale (a sequence number not above the recorded one: nothing
--        written). `continuous` = 1 when the share
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
local dropped = tonumber(ARGV[14])
local drop_id = tonumber(ARGV[15])
local tokens = tonumber(ARGV[16])

local st = redis.call('HMGET', KEYS[1], 'ep', 'learn', 'pool', 'pexp', 'free', 'acc', 'pcap',
  'pfrac')
local ep, learn
local pool, pexp = 0, 0
-- The rate no lease held after the last refresh (milli-tokens/s), its time, the pool's
-- cap then (tokens), and the fraction of a token accrued (10^-9 tokens).
local free0, acc, pcap, pfrac = 0, now, 0, 0
if not st[1] then
  -- New or lost (a restart without persistence). With learning on, grants held before
  -- the loss may live one lease lifetime more: until then nobody gets more than the
  -- share it reports spending (newcomers nothing), so the cap holds across the loss.
  ep = now; learn = 0
  if learn_on then learn = now + lease end
else
  ep = tonumber(st[1]); learn = tonumber(st[2])
  if st[3] then pool = tonumber(st[3]); pexp = tonumber(st[4]) end
  -- A state an older version of this script wrote lacks the idle-rate fields (or has
  -- them stale: all instances must run one version): with any absent, nothing accrues
  -- this call (the rate recorded may since have been granted); they are recorded below.
  if st[5] and st[6] and st[7] and st[8] then
    free0 = tonumber(st[5]); acc = tonumber(st[6]); pcap = tonumber(st[7])
    pfrac = tonumber(st[8])
  end
end
if pexp <= now then pool = 0; pfrac = 0 end
-- The idle rate accrues to the pool: since the last refresh the shares counted have only
-- expired (grants are made here alone), so at least `free0` was held by no lease all
-- along; and the bursts counted have only shrunk, so `pcap` still caps the pool. Where
-- Redis's clock stepped back (now < acc) nothing accrues, and `acc` keeps the largest
-- time seen (written below), so no interval accrues twice.
if free0 > 0 and acc < now and pool < pcap then
  local need = (pcap - pool) * 1e9 - pfrac
  local x = free0 * (now - acc)
  local before = pool
  if x >= need then
    pool = pcap; pfrac = 0
  else
    x = x + pfrac
    local whole = math.floor(x / 1e9)
    pool = pool + whole; pfrac = x - whole * 1e9
  end
  -- A pool held at pcap grows no more, so it expires one lease after it last grew and
  -- is rebuilt from empty (conservative: idle tokens lost, never minted).
  if pool > before then pexp = now + lease end
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
               hb = f[7], hexp = f[8], want = f[9], did = f[10] or 0}
  if all[i] == me_id then
    me = rec
  elseif rec.cexp <= now and rec.hexp <= now then
    dead[#dead + 1] = all[i]
  else
    others[#others + 1] = rec
  end
end
if me and seq <= me.seq then
  return {0, 0, 0, 0, 0, now, ep, 0, 0, 0}
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

-- Dropped tokens, credited once per id, for a share this state counted, at most what the
-- caller's counted burst shrank by (so its burst and the pool together keep their sum);
-- not while learning after a loss.
local did = 0
if me then did = me.did end
if drop_id > did and dropped > 0 and me and hexp > 0 and hseq ~= 0 and learn <= now
    and (hseq == me.seq or hseq == me.hseq) then
  local _, before_b = held(me)
  local credit = math.min(dropped, before_b - hb)
  if credit > 0 then
    pool = pool + credit
    pexp = now + lease
  end
end
if drop_id > did then did = drop_id end

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
local spread = R - minr
if spread < 0 then spread = 0 end
local target, level = mywant, nil
local rest, n = spread, #wants
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

local gr, gb, handed = 0, 0, 0
if not leave then
  local free_r, free_b = R - used_r, B - used_b - pool
  if free_b < 0 then free_b = 0 end
  gr = target
  if learn > now then gr = math.min(gr, hr) end
  if gr > free_r then gr = free_r end
  if gr < 0 then gr = 0 end
  -- The burst: a floor of two tokens per live instance and one newcomer (a small share
  -- then pays a decision that comes early, not only one a refill apart), the rest of B
  -- in proportion to the rate; so the bursts of the fair shares fit in B together, and a
  -- large share does not take the burst a small one needs (a floor of one, or none,
  -- where B is too small for two).
  local minb = 2
  if B < (#wants + 1) * minb then minb = 1 end
  if B < (#wants + 1) * minb then minb = 0 end
  gb = minb + math.floor((B - (#wants + 1) * minb) / R * gr)
  if gb < 1 and gr > 0 then gb = 1 end
  if learn > now and gb > hb then gb = hb end
  -- Tokens handed on from the pool: as many as the bucket has room for; their burst
  -- leaves the pool with them. Also where the pool blocks the burst (an idle fleet's
  -- pool may fill the burst kept for a newcomer).
  if learn <= now and pool > 0 and (gr < mywant or gb > free_b) then
    handed = math.min(pool, gb - math.min(tokens, gb))
    if handed < 0 then handed = 0 end
  end
  free_b = free_b + handed
  -- The pool yields the burst a grant needs: what still blocks it after the hand-on
  -- (the bucket had no room for it) leaves the pool unspent. Each token that leaves the
  -- pool frees one of burst, so the bursts plus the pool still fit in B.
  local evict = 0
  if gb > free_b and pool > handed then
    evict = math.min(pool - handed, gb - free_b)
    free_b = free_b + evict
  end
  if gb > free_b then gb = free_b end
  if gb < 0 then gb = 0 end
  -- Within 1/32 of the current share, and room for it: the same share again (fewer
  -- changes of the local bucket).
  if me and me.cexp > now and learn <= now and math.abs(gr - me.cr) * 32 <= me.cr
      and me.cr <= free_r and me.cb <= free_b and me.cb >= 1 then
    gr, gb = me.cr, me.cb
  end
  if gr == 0 or gb == 0 then gr, gb, evict = 0, 0, 0 end
  if handed > gb then handed = gb end
  pool = pool - handed - evict
end

local exp = now + lease
redis.call('HSET', KEYS[2], me_id, string.format('%.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f %.0f',
  seq, gr, gb, exp, hseq, hr, hb, hexp, mywant, did))
for i = 1, #dead, 256 do
  redis.call('HDEL', KEYS[2], unpack(dead, i, math.min(i + 255, #dead)))
end
-- What the caller may spend from now on (its grant, and its hold until it acknowledges):
-- the rate left idle accrues to the pool until the next refresh, up to the burst left.
local my_r, my_b = gr, gb
if hexp > now then
  if hr > my_r then my_r = hr end
  if hb > my_b then my_b = hb end
end
local free_after, cap_after = R - used_r - my_r, B - used_b - my_b
if free_after < 0 or learn > now then free_after = 0 end
if cap_after < 0 then cap_after = 0 end
if pool > cap_after then pool = cap_after; pfrac = 0 end
redis.call('HSET', KEYS[1], 'ep', ep, 'learn', learn, 'pool', pool, 'pexp', pexp,
  'free', string.format('%.0f', free_after), 'acc', string.format('%.0f', math.max(acc, now)),
  'pcap', string.format('%.0f', cap_after), 'pfrac', string.format('%.0f', pfrac))
-- Every record expires within one lifetime of its last grant: the keys outlive them all.
local ttl = math.floor((lease + 999) / 1000) + keep_ms
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
local live = 1
for _, rec in ipairs(others) do
  if rec.cexp > now then live = live + 1 end
end
return {1, gr, gb, exp, continuous, now, ep, live, target, handed}
