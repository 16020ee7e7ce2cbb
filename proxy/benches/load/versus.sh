#!/usr/bin/env bash
# Side by side in one sitting: the reference server (@restatedev/restate-server, pinned by
# proxy/benches/load/reference/package-lock.json, installed from npm on first use) and Sluice, both
# in front of the same Rust-SDK test deployment, loaded in turn with wrk (reference, Sluice,
# reference, Sluice, …: RUNS pairs, default 2) with unscoped calls to Greeter/greet.
# Usage: proxy/benches/load/versus.sh [connections] [seconds]
# Prints, for each run: req/s, p50 and p99, the server's CPU per call, the deployment's CPU per
# call, and the server's context switches and syscalls per call; then the ratios of the means.
# Release build as in run.sh (BIN_DIR=, SKIP_BUILD=1 apply); loopback only; perf for syscalls.
set -euo pipefail
cd "$(dirname "$0")/../../.."
connections="${1:-32}"
seconds="${2:-10}"
runs="${RUNS:-2}"
command -v perf >/dev/null || { echo "needs perf (apt-get install linux-perf)" >&2; exit 1; }
ref_dir=proxy/benches/load/reference
ref_bin="$ref_dir/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
if [ ! -x "$ref_bin" ]; then
  echo "versus: npm ci in $ref_dir (the reference server, about 200 MiB)" >&2
  (cd "$ref_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
# shellcheck source=common.sh
source proxy/benches/load/common.sh
read -r ref_ingress ref_admin ref_node < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
RESTATE_BASE_DIR="$work/reference" RESTATE_LISTEN_MODE=tcp RESTATE_DISABLE_TELEMETRY=true \
  RESTATE_LOG_FILTER=warn RESTATE_INGRESS__BIND_ADDRESS="127.0.0.1:$ref_ingress" \
  RESTATE_ADMIN__BIND_ADDRESS="127.0.0.1:$ref_admin" RESTATE_BIND_ADDRESS="127.0.0.1:$ref_node" \
  "$ref_bin" --no-logo >"$work/reference.log" 2>&1 &
reference=$!
# common.sh's trap stops Sluice and the deployment; this one stops the reference first.
trap 'kill -TERM "$reference" 2>/dev/null; kill -TERM "$server" 2>/dev/null; kill "$dep" 2>/dev/null; [ -n "$broker" ] && kill "$broker" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
await_health "$ref_admin" 300 || { echo "the reference server did not start:" >&2; cat "$work/reference.log" >&2; exit 1; }
register_deployment "$ref_admin"
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
# The reference may take a moment before its partitions serve: wait for one answered call.
for _ in $(seq 1 300); do
  curl -sf -X POST "http://127.0.0.1:$ref_ingress/Greeter/greet" -H 'content-type: application/json' -d '"warm"' >/dev/null && break
  sleep 0.1
done

# One measured run of wrk against url $2 of server process $3, labelled $1: appends a line of
# `label req/s p50_ms p99_ms server_us dep_us cs syscalls` (per call) to $work/runs.
measure() {
  local label=$1 url=$2 pid=$3
  wrk -t2 -c"$connections" -d2s -s "$work/post.lua" "$url" >/dev/null
  local cpu0 cs0 dep0
  cpu0=$(cpu_seconds "$pid"); cs0=$(ctx_switches "$pid"); dep0=$(cpu_seconds "$dep")
  perf stat -e raw_syscalls:sys_enter -x, -o "$work/syscalls" -p "$pid" -- sleep "$seconds" &
  local perf_pid=$!
  wrk -t2 -c"$connections" -d"${seconds}s" --latency -s "$work/post.lua" "$url" >"$work/wrk.out"
  local cpu1 cs1 dep1
  cpu1=$(cpu_seconds "$pid"); cs1=$(ctx_switches "$pid"); dep1=$(cpu_seconds "$dep")
  wait "$perf_pid"
  python3 - "$label" "$cpu1" "$cpu0" "$cs1" "$cs0" "$dep1" "$dep0" "$work/wrk.out" "$work/syscalls" >>"$work/runs" <<'PY'
import re, sys
label, cpu1, cpu0, cs1, cs0, dep1, dep0, wrk, syscalls = sys.argv[1:]
out = open(wrk).read()
calls = int(re.search(r"(\d+) requests in", out).group(1))
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
seconds = float(re.search(r"requests in ([\d.]+)s", out).group(1))
def ms(p):
    value, unit = re.search(rf"\s{p}%\s+([\d.]+)(us|ms|s)", out).groups()
    return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
count = 0
for line in open(syscalls):
    if "raw_syscalls:sys_enter" in line and line.split(",")[0].isdigit():
        count = int(line.split(",")[0])
n = max(calls, 1)
print(label, f"{calls / seconds:.0f}", f"{ms(50):.2f}", f"{ms(99):.2f}",
      f"{(float(cpu1) - float(cpu0)) * 1e6 / n:.1f}", f"{(float(dep1) - float(dep0)) * 1e6 / n:.1f}",
      f"{(int(cs1) - int(cs0)) / n:.2f}", f"{count / n:.2f}", errors.group(1) if errors else "0")
PY
}

for _ in $(seq 1 "$runs"); do
  measure reference "http://127.0.0.1:$ref_ingress/Greeter/greet" "$reference"
  measure sluice "$scheme://127.0.0.1:$ingress/Greeter/greet" "$server"
done
python3 - "$work/runs" "$connections" "$seconds" <<'PY'
import sys
rows = [line.split() for line in open(sys.argv[1])]
print(f"wrk -c{sys.argv[2]}, {sys.argv[3]} s per run, alternating; per call: server CPU, deployment CPU, server context switches and syscalls")
print(f"{'server':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU us':>8} {'dep us':>8} {'cs':>6} {'sysc':>6} {'non-2xx':>8}")
for r in rows:
    print(f"{r[0]:<10} {r[1]:>8} {r[2]:>8} {r[3]:>8} {r[4]:>8} {r[5]:>8} {r[6]:>6} {r[7]:>6} {r[8]:>8}")
def mean(label, i):
    values = [float(r[i]) for r in rows if r[0] == label]
    return sum(values) / len(values)
s, r = "sluice", "reference"
print(f"Sluice ÷ reference: req/s {mean(s, 1) / mean(r, 1):.2f}x, p50 {mean(s, 2) / mean(r, 2):.2f}x, "
      f"CPU per call {mean(s, 4) / mean(r, 4):.2f}x; Sluice's CPU per call ÷ the deployment's {mean(s, 4) / mean(s, 5):.2f}")
PY
