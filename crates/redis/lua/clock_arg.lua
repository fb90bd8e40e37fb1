-- The test clock: `now` (µs) is the last argument, so tests step time exactly.
local now = tonumber(ARGV[#ARGV])
