-- The fleet heartbeat: records this instance as seen at `now` (µs, from the clock prologue
-- before this body) and counts the instances seen within the window.
--
-- KEYS[1] sorted set of instance ids by the time each was last seen (µs).
-- ARGV: 1 instance id, 2 window (µs): an instance not seen for longer is dropped.
-- Reply: {instances seen within the window, this one included; now}.
local window = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('PEXPIRE', KEYS[1], math.floor(window / 1000) + 1)
return {redis.call('ZCARD', KEYS[1]), now}
