#!/usr/bin/env bash
# Load harness: throughput and latency of calls to a trivial handler (Greeter/greet) of the
# Rust SDK test deployment through Sluice, with wrk (apt `wrk`). Release build; loopback only;
# bounded in time. Usage: proxy/benches/load/run.sh [connections] [seconds]
# Flow control: SCOPE=acme calls /service/scope/acme/call/Greeter/greet with flow control on;
# RULE='{"pattern":"*","limits":{"concurrency":2}}' sets a rule first (default: none).
set -euo pipefail
cd "$(dirname "$0")/../../.."
connections="${1:-32}"
seconds="${2:-10}"
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
cargo build --release --locked -q -p sluice -p sluice-tests --bins
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
bin="$target_dir/release"
work="$(mktemp -d)"
# Three distinct free ports: the sockets are held together so none is handed out twice.
read -r dep_port ingress admin < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
"$bin/sluice-test-deployment" "127.0.0.1:$dep_port" v1 &
dep=$!
flags=()
[ -n "${SCOPE:-}" ] && flags=(env SERVICE_EXPERIMENTAL_ENABLE_PROTOCOL_V7=true SERVICE_EXPERIMENTAL_ENABLE_VQUEUES=true)
RUST_LOG=warn "${flags[@]}" "$bin/sluice" serve --data-dir "$work/data" --ingress-bind "127.0.0.1:$ingress" --admin-bind "127.0.0.1:$admin" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; kill "$dep" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$admin/health" >/dev/null && break; sleep 0.1; done
curl -sf -X POST "http://127.0.0.1:$admin/deployments" -H 'content-type: application/json' \
  -d "{\"uri\":\"http://127.0.0.1:$dep_port/\"}" >/dev/null
if [ -n "${RULE:-}" ]; then
  curl -sf -X PUT "http://127.0.0.1:$admin/limits/rules" -H 'content-type: application/json' -d "[$RULE]" >/dev/null
fi
path="/service/call/Greeter/greet"
[ -n "${SCOPE:-}" ] && path="/service/scope/$SCOPE/call/Greeter/greet"
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
# Warm up, then measure.
wrk -t2 -c"$connections" -d2s -s "$work/post.lua" "http://127.0.0.1:$ingress$path" >/dev/null
wrk -t2 -c"$connections" -d"${seconds}s" --latency -s "$work/post.lua" "http://127.0.0.1:$ingress$path"
echo "sluice RSS: $(awk '/VmRSS/ {print $2, $3}' /proc/$server/status)"
