-- The refill both scripts share (one definition: the scripts are composed from this
-- fragment at build time). Caps the balance `u` (units) at `limit`, then adds the refill
-- from `ts` to `now` (µs) exactly: `elapsed * rate` milli-units, the remainder carried in
-- `rem`; a balance that reaches `limit` drops its remainder. Computed only below the
-- time-to-full, so every intermediate stays below `limit * 1000 + rate`. A `now` behind
-- `ts` adds nothing and keeps `ts`. Returns u, ts, rem.
local function refill(u, ts, rem, limit, rate, now)
  if u > limit then u = limit end
  if now > ts then
    if u >= limit then
      rem = 0
    else
      local short = (limit - u) * 1000 - rem
      local elapsed = now - ts
      if elapsed > math.floor(short / rate) then
        u = limit; rem = 0
      else
        local total = elapsed * rate + rem
        local add = math.floor(total / 1000)
        u = u + add; rem = total - add * 1000
        if u >= limit then u = limit; rem = 0 end
      end
    end
    ts = now
  end
  return u, ts, rem
end
