#!/usr/bin/env bash
# Held backlog: fills one scope's queue with sends under `*` = 1 (the one admitted handler holds
# its slot for minutes), then reports Sluice's RSS and the latency of calls in another scope
# while the backlog waits. Release build; loopback only.
# Usage: proxy/benches/load/held.sh [backlog-seconds] [connections]
set -euo pipefail
cd "$(dirname "$0")/../../.."
seconds="${1:-20}"
connections="${2:-32}"
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
cargo build --release --locked -q -p sluice -p sluice-tests --bins
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
bin="$target_dir/release"
work="$(mktemp -d)"
read -r dep_port ingress admin < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
"$bin/sluice-test-deployment" "127.0.0.1:$dep_port" v1 &
dep=$!
RUST_LOG=warn SERVICE_EXPERIMENTAL_ENABLE_PROTOCOL_V7=true SERVICE_EXPERIMENTAL_ENABLE_VQUEUES=true \
  "$bin/sluice" serve --data-dir "$work/data" --ingress-bind "127.0.0.1:$ingress" --admin-bind "127.0.0.1:$admin" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; kill "$dep" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$admin/health" >/dev/null && break; sleep 0.1; done
curl -sf -X POST "http://127.0.0.1:$admin/deployments" -H 'content-type: application/json' \
  -d "{\"uri\":\"http://127.0.0.1:$dep_port/\"}" >/dev/null
curl -sf -X PUT "http://127.0.0.1:$admin/limits/rules" -H 'content-type: application/json' \
  -d '[{"pattern":"*","limits":{"concurrency":1}}]' >/dev/null
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
before=$(rss)
cat > "$work/hold.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "600000"
wrk.headers["content-type"] = "application/json"
LUA
cat > "$work/greet.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
echo "== filling the backlog: sends to scope 'held' for ${seconds}s"
wrk -t2 -c"$connections" -d"${seconds}s" -s "$work/hold.lua" \
  "http://127.0.0.1:$ingress/service/scope/held/send/Meter/hold" | grep -E "requests in|Requests/sec|Non-2xx"
sleep 2
held=$(curl -sf "http://127.0.0.1:$admin/limits/counters" | python3 -c 'import json,sys; print(sum(c["waiters"] for c in json.load(sys.stdin)["counters"]))')
after=$(rss)
echo "sluice RSS: ${before} kB before, ${after} kB with the backlog (queues waiting: ${held})"
echo "== calls in another scope while the backlog waits"
wrk -t1 -c4 -d5s --latency -s "$work/greet.lua" \
  "http://127.0.0.1:$ingress/service/scope/other/call/Greeter/greet" | grep -E "50%|99%|Requests/sec|Non-2xx"
