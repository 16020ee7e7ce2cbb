#!/usr/bin/env bash
# Load harness: throughput and latency of calls to a trivial handler (Greeter/greet) of the
# Rust SDK test deployment through Sluice, with wrk (apt `wrk`). Release build; loopback only;
# bounded in time. Usage: proxy/benches/load/run.sh [connections] [seconds]
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
RUST_LOG=warn "$bin/sluice" serve --data-dir "$work/data" --ingress-bind "127.0.0.1:$ingress" --admin-bind "127.0.0.1:$admin" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; kill "$dep" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$admin/health" >/dev/null && break; sleep 0.1; done
curl -sf -X POST "http://127.0.0.1:$admin/deployments" -H 'content-type: application/json' \
  -d "{\"uri\":\"http://127.0.0.1:$dep_port/\"}" >/dev/null
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
# Warm up, then measure.
wrk -t2 -c"$connections" -d2s -s "$work/post.lua" "http://127.0.0.1:$ingress/service/call/Greeter/greet" >/dev/null
wrk -t2 -c"$connections" -d"${seconds}s" --latency -s "$work/post.lua" "http://127.0.0.1:$ingress/service/call/Greeter/greet"
