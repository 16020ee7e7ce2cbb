#!/usr/bin/env bash
# Recovery after kill -9 with a held backlog: fills one scope's queue with sends under `*` = 1
# (held.sh's fill), kills Sluice with SIGKILL, starts it again on the same data dir and reports
# how long until it serves again: /ready answering 200 (partitions recovered), then a call in
# another scope answering 200, and how many invocations it holds after the restart. Release
# build; loopback only.
# Usage: proxy/benches/load/recovery.sh [fill-seconds] [connections]
# PERF_OUT=file also records a CPU profile of the restart until /ready answers.
# Raise the held caps for a large backlog, e.g.
# SERVICE_WORKER__MAX_HELD_PER_SCOPE=10000000 SERVICE_WORKER__MAX_HELD_INVOCATIONS=10000000.
set -euo pipefail
cd "$(dirname "$0")/../../.."
seconds="${1:-20}"
connections="${2:-32}"
export FLOW_CONTROL=1
# shellcheck source=common.sh
source proxy/benches/load/common.sh
hold_everything
echo "== filling the backlog: sends to scope 'held' for $seconds s"
wrk -t2 -c"$connections" -d"${seconds}s" -s "$work/hold.lua" \
  "http://127.0.0.1:$ingress/service/scope/held/send/Meter/hold" | grep -E "requests in|Requests/sec|Non-2xx"
held=$(waiting)
echo "held before the kill: $held; data dir $(du -sh "$work/data" | cut -f1)"
kill -KILL "$server"
wait "$server" 2>/dev/null || true
started=$(date +%s.%N)
RUST_LOG=warn "${flags[@]}" "$bin/sluice" serve --data-dir "$work/data" --ingress-bind "127.0.0.1:$ingress" --admin-bind "127.0.0.1:$admin" &
server=$!
# PERF_OUT=file records Sluice's stacks during the recovery (perf record, DWARF unwinding).
if [ -n "${PERF_OUT:-}" ]; then
  perf record -q -F 99 --call-graph dwarf,16384 -p "$server" -o "$PERF_OUT" &
  perf_pid=$!
fi
until curl -sf -o /dev/null "http://127.0.0.1:$admin/ready"; do
  kill -0 "$server" 2>/dev/null || { echo "sluice exited during recovery" >&2; exit 1; }
  sleep 0.05
done
healthy=$(date +%s.%N)
if [ -n "${perf_pid:-}" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; fi
until curl -sf -o /dev/null -X POST -H 'content-type: application/json' -d '"after"' \
  "http://127.0.0.1:$ingress/service/scope/other/call/Greeter/greet"; do
  sleep 0.05
done
served=$(date +%s.%N)
python3 -c "print(f'after kill -9 with $held held: ready in {$healthy - $started:.2f} s, a call in another scope answered in {$served - $started:.2f} s')"
echo "held after the restart: $(waiting); sluice RSS $(awk '/VmRSS/ {print $2, $3}' "/proc/$server/status")"
