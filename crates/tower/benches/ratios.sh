#!/usr/bin/env bash
# The HTTP goals' ratios from instruction counts (callgrind: whatever the machine's
# load), and from criterion's last run of the layer benchmark when there is one.
#
#   crates/tower/benches/ratios.sh            # N=20000 calls per case
#   N=100000 crates/tower/benches/ratios.sh
#
# Each case runs once under callgrind, counting only the N calls (the bench's `repeat`,
# after the service is built, the clock calibrated and one first call made): Ir / N is
# its instructions per call. The goals:
#   (a) the layer's own cost per admitted request (the case minus `bare`) over
#       tower_governor's, global and per IP: at most 1.0 (headers off; with them on,
#       reported);
#   (b) tower_governor's refusal over tokengate's (whole calls): at least 10;
#   (c) a global + tenant scoped decision (the verdict) over `acquire_all` of the same
#       two buckets: at most 1.25.
set -euo pipefail
cd "$(dirname "$0")/../../.."
N=${N:-20000}
cargo bench -p tokengate-tower --bench layer --no-run 2>/dev/null
bin=$(ls -t target/release/deps/layer-* | grep -v '\.d$' | head -1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

ir() { # case calls -> instructions of the calls
    LAYER_CALLS="$1:$2" valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
        --toggle-collect='layer::repeat*' "$bin" >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$out/cg"
}

declare -A per
cases="bare tokengate_global_quiet tokengate_global_fields governor_global
tokengate_per_ip_quiet tokengate_per_ip_fields tokengate_global_ip_quiet
tokengate_global_ip_fields governor_per_ip tokengate_refuse_global governor_refuse_global
tokengate_refuse_per_ip governor_refuse_per_ip engine_scoped_2 engine_scoped_2_decision
engine_acquire_all_2"
printf '%-28s %12s %12s\n' case 'Ir per call' 'minus bare'
for c in $cases; do
    a=$(ir "$c" "$N")
    per[$c]=$(awk -v a="$a" -v n="$N" 'BEGIN { printf "%.0f", a / n }')
    own=""
    if [ "$c" != bare ] && [ "${c#engine_}" = "$c" ]; then
        own=$((per[$c] - per[bare]))
    fi
    printf '%-28s %12s %12s\n' "$c" "${per[$c]}" "$own"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
own() { echo $((per[$1] - per[bare])); }
echo
echo "instructions (callgrind):"
echo "(a) own cost over tower_governor's, at most 1.0:"
echo "    global, headers off      $(ratio "$(own tokengate_global_quiet)" "$(own governor_global)")"
echo "    global, headers on       $(ratio "$(own tokengate_global_fields)" "$(own governor_global)")"
echo "    per IP, headers off      $(ratio "$(own tokengate_per_ip_quiet)" "$(own governor_per_ip)")"
echo "    per IP, headers on       $(ratio "$(own tokengate_per_ip_fields)" "$(own governor_per_ip)")"
echo "    global + IP, off (two scopes against governor's one)  $(ratio "$(own tokengate_global_ip_quiet)" "$(own governor_per_ip)")"
echo "(b) tower_governor's refusal over tokengate's, at least 10:"
echo "    global                   $(ratio "${per[governor_refuse_global]}" "${per[tokengate_refuse_global]}")"
echo "    per IP                   $(ratio "${per[governor_refuse_per_ip]}" "${per[tokengate_refuse_per_ip]}")"
echo "(c) scoped global + tenant over acquire_all_2, at most 1.25:"
echo "    verdict                  $(ratio "${per[engine_scoped_2]}" "${per[engine_acquire_all_2]}")"
echo "    whole decision           $(ratio "${per[engine_scoped_2_decision]}" "${per[engine_acquire_all_2]}")"

# criterion's medians of its last run, if any (ns per call per thread).
for threads in 1 2; do
    dir=target/criterion/layer_${threads}_thread
    [ -d "$dir" ] || continue
    declare -A ns=()
    for c in $cases; do
        f=$dir/$c/new/estimates.json
        [ -f "$f" ] || continue
        ns[$c]=$(grep -o '"median":{"confidence_interval":{[^}]*},"point_estimate":[0-9.e+-]*' "$f" | grep -o '[0-9.e+-]*$')
    done
    [ -n "${ns[bare]:-}" ] || continue
    nown() { awk -v a="${ns[$1]}" -v b="${ns[bare]}" 'BEGIN { printf "%.1f", a - b }'; }
    echo
    echo "criterion medians, $threads thread(s) (ns; the case minus bare where a layer's own):"
    for c in $cases; do
        [ -n "${ns[$c]:-}" ] && printf '  %-28s %10.1f\n' "$c" "${ns[$c]}"
    done
    echo "(a) global off $(ratio "$(nown tokengate_global_quiet)" "$(nown governor_global)"), on $(ratio "$(nown tokengate_global_fields)" "$(nown governor_global)"); per IP off $(ratio "$(nown tokengate_per_ip_quiet)" "$(nown governor_per_ip)"), on $(ratio "$(nown tokengate_per_ip_fields)" "$(nown governor_per_ip)")"
    echo "(b) global $(ratio "${ns[governor_refuse_global]}" "${ns[tokengate_refuse_global]}"), per IP $(ratio "${ns[governor_refuse_per_ip]}" "${ns[tokengate_refuse_per_ip]}")"
    echo "(c) verdict $(ratio "${ns[engine_scoped_2]}" "${ns[engine_acquire_all_2]}"), decision $(ratio "${ns[engine_scoped_2_decision]}" "${ns[engine_acquire_all_2]}")"
done
