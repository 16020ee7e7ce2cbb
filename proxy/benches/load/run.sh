#!/usr/bin/env bash
# Load harness: throughput and latency of calls to a trivial handler (Greeter/greet) of the
# Rust SDK test deployment through Sluice, with wrk (apt `wrk`). Release build; loopback only;
# bounded in time. Usage: proxy/benches/load/run.sh [connections] [seconds]
# Flow control: SCOPE=acme calls /service/scope/acme/call/Greeter/greet with flow control on;
# RULE='{"pattern":"*","limits":{"concurrency":2}}' sets a rule first (default: none).
# NAGLE=1 serves the deployment with the SDK's own HttpServer (Nagle's algorithm on).
# TLS=1 serves the ingress over HTTPS (a self-signed certificate; wrk keeps its connections, so
# this measures TLS per request, not per handshake).
# THREADS=1 also prints the CPU and context switches per call of each of Sluice's threads (by
# name; `preempted`: the involuntary ones among them); PIN_SLUICE=cpus pins Sluice's threads to those vCPUs (taskset list), e.g. 0.
# WAKES=1 also prints the wake-ups on the box per call, by waker and wakee thread (perf).
# SYSCALLS=1 also prints Sluice's system calls per call, by call (perf, the syscalls tracepoints;
# counting slows Sluice by about half, so that run's req/s and CPU are not comparable).
# Every run prints Sluice's syncs (fdatasync, fsync) per call beside its CPU and switches.
# PERF_OUT=file also records a CPU profile of Sluice during the measured run (see below).
# KEYS=n sends each call under a limit key drawn at random from n (`k1` … `kn`, header
# `x-service-limit-key`; with SCOPE): KEYS=10 against KEYS=1000000 is what the key cardinality
# costs (set RULE to a per-key rule such as '{"pattern":"acme/*","limits":{"concurrency":8}}').
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
if [ -n "${KEYS:-}" ]; then
  cat >> "$work/post.lua" <<LUA
math.randomseed(os.time() + math.floor(os.clock() * 1000000))
request = function()
  wrk.headers["x-service-limit-key"] = "k" .. math.random($KEYS)
  return wrk.format()
end
LUA
fi
# Warm up, then measure.
wrk -t2 -c"$connections" -d2s -s "$work/post.lua" "$scheme://127.0.0.1:$ingress$path" >/dev/null
# PERF_OUT=file records Sluice's stacks while wrk measures (perf record, DWARF unwinding):
# `perf script -i file | inferno-collapse-perf | inferno-flamegraph > flame.svg`.
if [ -n "${PERF_OUT:-}" ]; then
  perf record -q -F 199 --call-graph dwarf,16384 -p "$server" -o "$PERF_OUT" -- sleep "$seconds" &
  perf_pid=$!
fi
# WAKES=1 records every wake-up on the box while wrk measures (perf, sched:sched_waking) and
# prints those per call by waker and wakee thread name, and how many crossed vCPUs.
if [ "${WAKES:-0}" = 1 ]; then
  perf record -q -e sched:sched_waking -a -o "$work/wakes.data" -- sleep "$seconds" 2>/dev/null &
  wakes_pid=$!
fi
[ "${THREADS:-0}" = 1 ] && thread_counters "$server" > "$work/threads.before"
# Every run counts Sluice's syncs of its files (fdatasync and fsync) while wrk measures.
syncs_pid=""
if command -v perf >/dev/null; then
  perf stat -e syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync -x, -o "$work/syncs" -p "$server" -- sleep "$seconds" &
  syncs_pid=$!
fi
if [ "${SYSCALLS:-0}" = 1 ]; then
  perf stat -e 'syscalls:sys_enter_*' -x, -o "$work/syscalls" -p "$server" -- sleep "$seconds" 2>/dev/null &
  syscalls_pid=$!
fi
cpu_before=$(cpu_seconds "$server")
ctx_before=$(ctx_switches "$server")
dep_before=$(cpu_seconds "$dep")
wrk -t2 -c"$connections" -d"${seconds}s" --latency -s "$work/post.lua" "$scheme://127.0.0.1:$ingress$path" | tee "$work/wrk.out"
cpu_after=$(cpu_seconds "$server")
ctx_after=$(ctx_switches "$server")
dep_after=$(cpu_seconds "$dep")
[ "${THREADS:-0}" = 1 ] && thread_counters "$server" > "$work/threads.after"
syncs=nan
if [ -n "$syncs_pid" ]; then
  wait "$syncs_pid" || true
  syncs=$(awk -F, '$1 ~ /^[0-9]+$/ {n += $1} END {print n + 0}' "$work/syncs")
fi
requests=$(awk '/requests in/ {print $1}' "$work/wrk.out")
python3 -c "
cpu = $cpu_after - $cpu_before
syncs = float('$syncs')
print(f'sluice CPU: {cpu:.2f} s over $seconds s ({cpu / $seconds:.2f} cores), {cpu * 1e6 / max($requests, 1):.1f} us per call, {($ctx_after - $ctx_before) / max($requests, 1):.2f} context switches and {syncs / max($requests, 1):.3f} syncs per call; deployment {($dep_after - $dep_before) / $seconds:.2f} cores')"
if [ "${SYSCALLS:-0}" = 1 ]; then
  wait "$syscalls_pid" || true
  python3 - "$work/syscalls" "$requests" <<'PY'
import sys
calls = max(int(sys.argv[2]), 1)
counts = []
for line in open(sys.argv[1]):
    fields = line.split(",")
    if len(fields) > 2 and fields[0].isdigit() and int(fields[0]) > 0:
        counts.append((int(fields[0]), fields[2].removeprefix("syscalls:sys_enter_")))
print(f"{'system call':<20} {'per call':>8}   (all: {sum(n for n, _ in counts) / calls:.2f})")
for n, name in sorted(counts, reverse=True)[:15]:
    print(f"{name:<20} {n / calls:>8.3f}")
PY
fi
if [ "${WAKES:-0}" = 1 ]; then
  wait "$wakes_pid" || true
  perf script -i "$work/wakes.data" -F comm,cpu,trace 2>/dev/null >"$work/wakes.txt"
  python3 - "$work/wakes.txt" "$requests" <<'PY'
import collections, re, sys
calls = max(int(sys.argv[2]), 1)
wakes = collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r"\s*(.+?)\s+\[(\d+)\]\s+comm=(.+?) pid=\d+ prio=\d+ target_cpu=(\d+)", line)
    if m:
        waker, cpu, wakee, target = m.groups()
        where = "other vCPU" if int(cpu) != int(target) else "same vCPU"
        wakes[(waker, wakee, where)] += 1
print(f"{'waker':<18} {'wakee':<18} {'where':<11} {'per call':>8}")
for (waker, wakee, where), n in wakes.most_common(20):
    print(f"{waker:<18} {wakee:<18} {where:<11} {n / calls:>8.3f}")
PY
fi
# THREADS=1: where the CPU and the context switches went, by thread name.
if [ "${THREADS:-0}" = 1 ]; then
  python3 - "$work/threads.before" "$work/threads.after" "$requests" "$(getconf CLK_TCK)" <<'PY'
import sys
def read(path):
    rows = {}
    for line in open(path):
        tid, cpu, cs, forced, name = line.split(maxsplit=4)
        rows[tid] = (int(float(cpu)), int(cs), int(forced), name.strip())
    return rows
before, after = read(sys.argv[1]), read(sys.argv[2])
calls, hz = max(int(sys.argv[3]), 1), int(sys.argv[4])
by_name = {}
for tid, (cpu, cs, forced, name) in after.items():
    cpu0, cs0, forced0, _ = before.get(tid, (0, 0, 0, name))
    total = by_name.setdefault(name, [0, 0, 0, 0])
    total[0] += 1; total[1] += cpu - cpu0; total[2] += cs - cs0; total[3] += forced - forced0
print(f"{'threads':<24} {'n':>3} {'CPU us/call':>12} {'ctx sw/call':>12} {'preempted':>10}")
for name, (n, cpu, cs, forced) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
    if cpu or cs:
        print(f"{name:<24} {n:>3} {cpu * 1e6 / hz / calls:>12.1f} {cs / calls:>12.2f} {forced / calls:>10.2f}")
PY
fi
[ -n "${perf_pid:-}" ] && wait "$perf_pid"
echo "sluice RSS: $(awk '/VmRSS/ {print $2, $3}' /proc/$server/status)"
