# Shared by the load harnesses: builds release binaries (PROFILE=debug: uses the debug ones as built; SKIP_BUILD=1: measures the release ones already built; BIN_DIR=dir: the binaries in dir, e.g. a copy of an
# older build to compare with), starts the Rust SDK test deployment (NAGLE=1: served by the SDK's
# own HttpServer, Nagle's algorithm on, as users' deployments are by default) and
# `sluice serve` on free loopback ports (FLOW_CONTROL=1 also switches it on in binaries older than
# flow control by default; CLUSTER=1: one node
# in cluster mode over a kcat-hosted mock Kafka cluster of three brokers, see docs/cluster.md),
# registers the deployment, and stops both on exit (TLS=1: the ingress over HTTPS). Sets: bin,
# work, ingress, admin, server, dep, scheme.
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
# The bootstrap servers a mock broker logged in file $1 (waits up to 10 s for the line).
bootstrap_in() {
  local found=""
  for _ in $(seq 1 100); do
    found=$(grep -o 'bootstrap.servers=[0-9.:,]*' "$1" | head -1 | cut -d= -f2) || true
    [ -n "$found" ] && break
    sleep 0.1
  done
  [ -n "$found" ] || { echo "the mock broker did not start" >&2; exit 1; }
  echo "$found"
}
flags=(env)
[ "${FLOW_CONTROL:-0}" = 1 ] && flags+=(SERVICE_EXPERIMENTAL_ENABLE_PROTOCOL_V7=true SERVICE_EXPERIMENTAL_ENABLE_VQUEUES=true)
# TLS=1: the ingress serves HTTPS with a fresh self-signed certificate; $scheme is then https.
scheme=http
if [ "${TLS:-0}" = 1 ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=localhost -keyout "$work/ingress.key" -out "$work/ingress.crt" 2>/dev/null
  flags+=("SERVICE_INGRESS__TLS_CERT_FILE=$work/ingress.crt" "SERVICE_INGRESS__TLS_KEY_FILE=$work/ingress.key")
  scheme=https
fi
broker=""
if [ "${CLUSTER:-0}" = 1 ]; then
  partitions="${SERVICE_WORKER__PARTITIONS:-8}"
  # librdkafka's mock brokers in a process of their own, with the cluster's topics (the mock
  # answers no CreateTopics); the debug build of the tiny host is enough.
  kafka="$bin/sluice-test-kafka"
  [ -x "$kafka" ] || { cargo build -q --locked -p sluice-tests --bin sluice-test-kafka; kafka="$target_dir/debug/sluice-test-kafka"; }
  "$kafka" 3 "sluice.log:$partitions" "sluice.leaders:$partitions" "sluice.inbox:$partitions" "sluice.snapshots:$partitions" sluice.meta:1 sluice.epochs:1 >"$work/broker.log" 2>&1 &
  broker=$!
  bootstrap=$(bootstrap_in "$work/broker.log")
  flags+=(SERVICE_CLUSTER__MODE=kafka "SERVICE_CLUSTER__BOOTSTRAP_SERVERS=$bootstrap" SERVICE_CLUSTER__NODE_ID=bench SERVICE_CLUSTER__SESSION_TIMEOUT=3s SERVICE_CLUSTER__SECRET=bench-cluster-node-secret
    # The mock brokers describe no topic settings.
    SERVICE_CLUSTER__ALLOW_UNCONFIRMED_RETENTION=true)
fi
RUST_LOG=warn "${flags[@]}" "$bin/sluice" serve --data-dir "$work/data" --ingress-bind "127.0.0.1:$ingress" --admin-bind "127.0.0.1:$admin" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; kill "$dep" 2>/dev/null; [ -n "$broker" ] && kill "$broker" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
# Waits up to $2 tenths of a second for the admin API on port $1 to answer /health.
await_health() {
  for _ in $(seq 1 "$2"); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.1; done
  return 1
}
# Registers the deployment with the admin API on port $1 (Sluice's, or the reference's).
register_deployment() {
  curl -sf -X POST "http://127.0.0.1:$1/deployments" -H 'content-type: application/json' \
    -d "{\"uri\":\"http://127.0.0.1:$dep_port/\"}" >/dev/null
}
await_health "$admin" 100 || true
if [ -n "$broker" ]; then
  # Ready once the node leads every partition.
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$admin/cluster-health" | python3 -c 'import json,sys; p=json.load(sys.stdin)["sluice_cluster"]["partitions"]; sys.exit(0 if all(x["led_here"] for x in p) else 1)' && break
    sleep 0.1
  done
fi
# CPU seconds (user + system) a process has used so far, from /proc.
cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
# Context switches of every thread of process $1 so far (voluntary and not).
ctx_switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {n += $2} END {print n + 0}'; }
# Per thread of process $1, one line each: its tid, CPU ticks, context switches and name.
thread_counters() {
  local t name
  for t in /proc/"$1"/task/*; do
    name="$(cat "$t/comm" 2>/dev/null)" || continue
    awk -v tid="${t##*/}" -v name="${name// /_}" \
      'FILENAME ~ /stat$/ {cpu = $14 + $15} /^voluntary_ctxt_switches/ {v = $2} /nonvoluntary_ctxt_switches/ {n = $2} END {print tid, cpu, v + n, n + 0, name}' \
      "$t/stat" "$t/status" 2>/dev/null || true
  done
}
register_deployment "$admin"
# PIN_SLUICE=cpus (a taskset list) pins every thread of Sluice to those vCPUs.
[ -n "${PIN_SLUICE:-}" ] && taskset -a -p -c "$PIN_SLUICE" "$server" >/dev/null
# Held backlogs (held.sh, recovery.sh): `*` = 1 for every scope, so one admitted Meter/hold
# (its slot held for ten minutes, the body of $work/hold.lua) keeps every later send of its scope
# waiting; `waiting` prints how many invocations wait in queues.
hold_everything() {
  curl -sf -X PUT "http://127.0.0.1:$admin/limits/rules" -H 'content-type: application/json' \
    -d '[{"pattern":"*","limits":{"concurrency":1}}]' >/dev/null
  cat > "$work/hold.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "600000"
wrk.headers["content-type"] = "application/json"
LUA
}
waiting() {
  curl -sf -X POST "http://127.0.0.1:$admin/query" -H 'accept: application/json' \
    -H 'content-type: application/json' \
    -d '{"query":"SELECT coalesce(sum(num_inbox), 0) AS n FROM sys_vqueue_meta"}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["rows"][0]["n"])'
}
