#!/usr/bin/env bash
# Loopback benchmark of the layer: a hello-world axum handler with no limiter, with
# tokengate's layer (global + per-IP scopes) and with tower_governor's (per-IP), each
# admitting everything and refusing (nearly) everything. wrk, two client threads; the
# modes run interleaved, ROUNDS times, so the ratios come from one run on one machine.
#
#   crates/tower/bench.sh            # DURATION=5s CONNECTIONS=32 ROUNDS=2
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p tokengate-tower --example bench_server
bin=target/release/examples/bench_server
duration=${DURATION:-5s}
connections=${CONNECTIONS:-32}
rounds=${ROUNDS:-2}
port=${PORT:-3101}
out=$(mktemp -d)
printf '%-6s %-17s %10s %9s %9s\n' round mode req/s p99 non-2xx
for round in $(seq "$rounds"); do
  for mode in none tokengate tokengate-quiet governor tokengate-refuse governor-refuse; do
    "$bin" "$mode" "$port" &
    pid=$!
    for _ in $(seq 100); do
      curl -s -o /dev/null "http://127.0.0.1:$port/" && break
      sleep 0.05
    done
    wrk -t2 -c"$connections" -d"$duration" --latency "http://127.0.0.1:$port/" \
      > "$out/$mode.$round.txt"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    rps=$(awk '/^Requests\/sec/ {print $2}' "$out/$mode.$round.txt")
    p99=$(awk '$1 == "99%" {print $2}' "$out/$mode.$round.txt")
    non2xx=$(awk '/Non-2xx/ {print $5}' "$out/$mode.$round.txt")
    printf '%-6s %-17s %10s %9s %9s\n' "$round" "$mode" "$rps" "$p99" "${non2xx:-0}"
    echo "$mode $rps $p99" >> "$out/all"
    port=$((port + 1))
  done
done
echo
echo "median over $rounds rounds (p99 in ms):"
for mode in none tokengate tokengate-quiet governor tokengate-refuse governor-refuse; do
  awk -v m="$mode" '$1 == m {
      p = $3; if (p ~ /us$/) p = p / 1000; else if (p ~ /ms$/) p = p + 0; else if (p ~ /s$/) p = p * 1000;
      print $2, p }' "$out/all" |
    sort -n | awk -v m="$mode" '{ r[NR] = $1; q[NR] = $2 } END {
      n = asort(q); mid = int((NR + 1) / 2); printf "%-17s %10.0f req/s  p99 %7.2f ms\n", m, r[mid], q[mid] }'
done
echo
echo "CPU per request, the app called in process (no sockets; perf stat task-clock):"
for mode in none tokengate tokengate-quiet governor tokengate-refuse governor-refuse; do
  if command -v perf > /dev/null; then
    perf stat -x, -e task-clock "$bin" inproc "$mode" 2>&1 >/dev/null |
      awk -F, -v m="$mode" '/task-clock/ { printf "%-17s %6.2f us\n", m, $1 * 1000 / 200000 }'
  else
    "$bin" inproc "$mode"
  fi
done
echo "raw wrk output: $out"
