#!/usr/bin/env bash
# Load harness: throughput and latency of calls to a trivial handler (Greeter/greet) of the
# Rust SDK test deployment through Sluice, with wrk (apt `wrk`). Release build; loopback only;
# bounded in time. Usage: proxy/benches/load/run.sh [connections] [seconds]
# Flow control: SCOPE=acme calls /service/scope/acme/call/Greeter/greet with flow control on;
# RULE='{"pattern":"*","limits":{"concurrency":2}}' sets a rule first (default: none).
# NAGLE=1 serves the deployment with the SDK's own HttpServer (Nagle's algorithm on).
# TLS=1 serves the ingress over HTTPS (a self-signed certificate; wrk keeps its connections, so
# this measures TLS per request, not per handshake).
# PERF_OUT=file also records a CPU profile of Sluice during the measured run (see below).
# PLUGIN=tenant-header loads that example plugin as an extract plugin first (it finds no
# x-tenant header, so calls stay as they are: the cost measured is the plugin call itself).
set -euo pipefail
cd "$(dirname "$0")/../../.."
connections="${1:-32}"
seconds="${2:-10}"
[ -n "${SCOPE:-}" ] && export FLOW_CONTROL=1
# shellcheck source=common.sh
source proxy/benches/load/common.sh
if [ -n "${RULE:-}" ]; then
  curl -sf -X PUT "http://127.0.0.1:$admin/limits/rules" -H 'content-type: application/json' -d "[$RULE]" >/dev/null
fi
if [ -n "${PLUGIN:-}" ]; then
  cargo build -q --release --locked --target wasm32-wasip2 --manifest-path plugins/Cargo.toml --target-dir "$target_dir/plugins"
  curl -sf -X PUT "http://127.0.0.1:$admin/plugins/$PLUGIN?hook=extract" -H 'content-type: application/wasm' \
    --data-binary "@$target_dir/plugins/wasm32-wasip2/release/${PLUGIN//-/_}.wasm" >/dev/null
fi
path="/service/call/Greeter/greet"
[ -n "${SCOPE:-}" ] && path="/service/scope/$SCOPE/call/Greeter/greet"
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
# Warm up, then measure.
wrk -t2 -c"$connections" -d2s -s "$work/post.lua" "$scheme://127.0.0.1:$ingress$path" >/dev/null
# PERF_OUT=file records Sluice's stacks while wrk measures (perf record, DWARF unwinding):
# `perf script -i file | inferno-collapse-perf | inferno-flamegraph > flame.svg`.
if [ -n "${PERF_OUT:-}" ]; then
  perf record -q -F 199 --call-graph dwarf,16384 -p "$server" -o "$PERF_OUT" -- sleep "$seconds" &
  perf_pid=$!
fi
cpu_before=$(cpu_seconds "$server")
ctx_before=$(ctx_switches "$server")
dep_before=$(cpu_seconds "$dep")
wrk -t2 -c"$connections" -d"${seconds}s" --latency -s "$work/post.lua" "$scheme://127.0.0.1:$ingress$path" | tee "$work/wrk.out"
cpu_after=$(cpu_seconds "$server")
ctx_after=$(ctx_switches "$server")
dep_after=$(cpu_seconds "$dep")
requests=$(awk '/requests in/ {print $1}' "$work/wrk.out")
python3 -c "
cpu = $cpu_after - $cpu_before
print(f'sluice CPU: {cpu:.2f} s over $seconds s ({cpu / $seconds:.2f} cores), {cpu * 1e6 / max($requests, 1):.1f} us per call, {($ctx_after - $ctx_before) / max($requests, 1):.2f} context switches per call; deployment {($dep_after - $dep_before) / $seconds:.2f} cores')"
[ -n "${perf_pid:-}" ] && wait "$perf_pid"
echo "sluice RSS: $(awk '/VmRSS/ {print $2, $3}' /proc/$server/status)"
