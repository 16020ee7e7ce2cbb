# Shared by the load harnesses: builds release binaries (PROFILE=debug: uses the debug ones as built; SKIP_BUILD=1: measures the release ones already built; BIN_DIR=dir: the binaries in dir, e.g. a copy of an
# older build to compare with), starts the Rust SDK test deployment (NAGLE=1: served by the SDK's
# own HttpServer, Nagle's algorithm on, as users' deployments are by default) and
# `sluice serve` on free loopback ports (flow control on when FLOW_CONTROL=1), registers the
# deployment, and stops both on exit. Sets: bin, work, ingress, admin, server, dep.
# Source it from the workspace root after `set -euo pipefail`.
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)" >&2; exit 1; }
profile="${PROFILE:-release}"
[ "$profile" = release ] && [ "${SKIP_BUILD:-0}" != 1 ] && [ -z "${BIN_DIR:-}" ] && cargo build --release --locked -q -p sluice -p sluice-tests --bins
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
bin="${BIN_DIR:-$target_dir/$profile}"
work="$(mktemp -d)"
# Three distinct free ports: the sockets are held together so none is handed out twice.
read -r dep_port ingress admin < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
dep_server=own
[ "${NAGLE:-0}" = 1 ] && dep_server=sdk
SLUICE_TEST_DEPLOYMENT_SERVER="$dep_server" "$bin/sluice-test-deployment" "127.0.0.1:$dep_port" v1 &
dep=$!
flags=()
[ "${FLOW_CONTROL:-0}" = 1 ] && flags=(env SERVICE_EXPERIMENTAL_ENABLE_PROTOCOL_V7=true SERVICE_EXPERIMENTAL_ENABLE_VQUEUES=true)
RUST_LOG=warn "${flags[@]}" "$bin/sluice" serve --data-dir "$work/data" --ingress-bind "127.0.0.1:$ingress" --admin-bind "127.0.0.1:$admin" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; kill "$dep" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$admin/health" >/dev/null && break; sleep 0.1; done
# CPU seconds (user + system) a process has used so far, from /proc.
cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
curl -sf -X POST "http://127.0.0.1:$admin/deployments" -H 'content-type: application/json' \
  -d "{\"uri\":\"http://127.0.0.1:$dep_port/\"}" >/dev/null
