-- The production clock: Redis TIME, µs since 1970 on the server's wall clock.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
