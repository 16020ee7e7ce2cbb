#!/usr/bin/env bash
# Held backlog: fills one scope's queue with sends under `*` = 1 (the one admitted handler holds
# its slot for minutes), then reports Sluice's RSS and the latency of calls in another scope
# while the backlog waits. Release build; loopback only.
# Usage: proxy/benches/load/held.sh [backlog-seconds] [connections]
set -euo pipefail
cd "$(dirname "$0")/../../.."
seconds="${1:-20}"
connections="${2:-32}"
export FLOW_CONTROL=1
# shellcheck source=common.sh
source proxy/benches/load/common.sh
hold_everything
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
before=$(rss)
cat > "$work/greet.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
# Two fills: the second's RSS growth per held invocation is the backlog's marginal cost, without
# the fixed costs (redb's page cache, buffers) the first fill also pays.
fill() {
  echo "== filling the backlog: sends to scope 'held' for $1 s"
  wrk -t2 -c"$connections" -d"${1}s" -s "$work/hold.lua" \
    "http://127.0.0.1:$ingress/service/scope/held/send/Meter/hold" | grep -E "requests in|Requests/sec|Non-2xx"
  sleep 2
}
half=$((seconds / 2))
fill "$half"
mid_held=$(waiting)
mid=$(rss)
fill "$((seconds - half))"
held=$(waiting)
after=$(rss)
echo "sluice RSS: ${before} kB before, ${mid} kB holding ${mid_held}, ${after} kB holding ${held}"
python3 -c "
print(f'per held invocation: {($after - $before) * 1024 / $held:.0f} B overall, {($after - $mid) * 1024 / max($held - $mid_held, 1):.0f} B marginal (second fill)')"
echo "== calls in another scope while the backlog waits"
wrk -t1 -c4 -d5s --latency -s "$work/greet.lua" \
  "http://127.0.0.1:$ingress/service/scope/other/call/Greeter/greet" | grep -E "50%|99%|Requests/sec|Non-2xx"
