#!/usr/bin/env bash
# Many limit keys waiting at once: fills scope 'held' (held to one call at a time, `*` = 1) with
# sends for [fill-seconds], each under a limit key of its own while keys last (`k1` … `kKEYS`,
# then round again), so every key is a counter and a queue of its own. Then reports:
#   - the waiting calls, their queues, and Sluice's RSS per waiting call;
#   - how long SQL, the counters and queues routes and the dashboard's page take to answer;
#   - recovery after kill -9 (until /ready, and until a call in another scope answers);
#   - a bulk cancel of the whole scope: how long it takes, and the p50/p99 of calls in another
#     scope meanwhile.
# Release build; loopback only. Usage: proxy/benches/load/keys.sh [fill-seconds] [connections]
# KEYS=n (default 1000000). The held caps are raised to 4,000,000 for it.
set -euo pipefail
cd "$(dirname "$0")/../../.."
seconds="${1:-100}"
connections="${2:-32}"
keys="${KEYS:-1000000}"
export FLOW_CONTROL=1
export SERVICE_WORKER__MAX_HELD_PER_SCOPE=4000000 SERVICE_WORKER__MAX_HELD_INVOCATIONS=4000000
# shellcheck source=common.sh
source proxy/benches/load/common.sh
hold_everything
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
# Seconds $1 (a curl command line's arguments) takes to answer, and its status.
timed() { curl -s -o /dev/null -w '%{http_code} in %{time_total} s' "$@"; }
query() {
  timed -X POST "http://127.0.0.1:$admin/query" -H 'content-type: application/json' \
    -d "{\"query\":\"$1\"}"
}
# Each wrk thread numbers its requests; thread t of 2 takes the odd or even keys.
cat > "$work/keyed.lua" <<LUA
local counter = 0
local threads = 0
setup = function(thread)
  thread:set("id", threads)
  threads = threads + 1
end
request = function()
  counter = counter + 1
  local key = (counter * 2 + id) % $keys + 1
  return wrk.format("POST", nil, {["content-type"] = "application/json", ["x-service-limit-key"] = "k" .. key}, "600000")
end
LUA
before=$(rss)
echo "== filling: sends to scope 'held' for $seconds s, $keys keys"
wrk -t2 -c"$connections" -d"${seconds}s" -s "$work/keyed.lua" \
  "http://127.0.0.1:$ingress/service/scope/held/send/Meter/hold" | grep -E "requests in|Requests/sec|Non-2xx"
sleep 2
held=$(waiting)
after=$(rss)
echo "waiting: $held; sluice RSS ${before} kB before, ${after} kB after"
python3 -c "print(f'per waiting call: {($after - $before) * 1024 / max($held, 1):.0f} B')"
echo "== answer times"
echo "SQL count of queues:          $(query 'SELECT count(*) FROM sys_vqueues')"
echo "SQL 100 busiest keys:         $(query 'SELECT l1, num_waiters FROM sys_user_limits WHERE scope = '"'"'held'"'"' ORDER BY num_waiters DESC LIMIT 100')"
echo "SQL 100 busiest, bounded:     $(query 'SELECT l1, num_queued FROM sys_user_limits WHERE scope = '"'"'held'"'"' ORDER BY num_queued DESC LIMIT 100')"
echo "SQL any 100 keys:             $(query 'SELECT scope, l1, num_waiters FROM sys_user_limits LIMIT 100')"
echo "SQL the scope's queue meta:   $(query 'SELECT count(*) FROM sys_vqueue_meta WHERE scope = '"'"'held'"'"'')"
echo "SQL any 100 queues:           $(query 'SELECT id, num_inbox FROM sys_scheduler LIMIT 100')"
echo "SQL waiting under one key:    $(query 'SELECT id FROM sys_invocation WHERE limit_key = '"'"'k7'"'"'')"
echo "SQL the scope's key k7:       $(query 'SELECT id FROM sys_invocation WHERE scope = '"'"'held'"'"' AND limit_key = '"'"'k7'"'"'')"
echo "SQL count of invocations:     $(query 'SELECT count(*) FROM sys_invocation')"
echo "SQL count of the scope's:     $(query 'SELECT count(*) FROM sys_invocation WHERE scope = '"'"'held'"'"'')"
echo "SQL count of the scope's counters: $(query 'SELECT count(*) FROM sys_user_limits WHERE scope = '"'"'held'"'"'')"
echo "GET /limits/counters:         $(timed "http://127.0.0.1:$admin/limits/counters")"
echo "GET /limits/counters?scope=held&limit=100000: $(timed "http://127.0.0.1:$admin/limits/counters?scope=held&limit=100000")"
echo "GET /vqueues:                 $(timed "http://127.0.0.1:$admin/vqueues")"
echo "GET /metrics:                 $(timed "http://127.0.0.1:$admin/metrics")"
echo "GET /ui/ (the dashboard):     $(timed -L "http://127.0.0.1:$admin/ui/")"
echo "GET /limits/history:          $(timed "http://127.0.0.1:$admin/limits/history")"
echo "== kill -9 and recovery"
kill -KILL "$server"
wait "$server" 2>/dev/null || true
started=$(date +%s.%N)
RUST_LOG=warn "${flags[@]}" "$bin/sluice" serve --data-dir "$work/data" --ingress-bind "127.0.0.1:$ingress" --admin-bind "127.0.0.1:$admin" &
server=$!
until curl -sf -o /dev/null "http://127.0.0.1:$admin/ready"; do
  kill -0 "$server" 2>/dev/null || { echo "sluice exited during recovery" >&2; exit 1; }
  sleep 0.05
done
ready=$(date +%s.%N)
until curl -sf -o /dev/null -X POST -H 'content-type: application/json' -d '"after"' \
  "http://127.0.0.1:$ingress/service/scope/other/call/Greeter/greet"; do
  sleep 0.05
done
served=$(date +%s.%N)
python3 -c "print(f'ready in {$ready - $started:.2f} s, a call in another scope answered in {$served - $started:.2f} s')"
echo "waiting after the restart: $(waiting); sluice RSS $(rss) kB"
echo "== bulk cancel of scope 'held', calls in another scope meanwhile"
cat > "$work/greet.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
wrk -t1 -c4 -d30s --latency -s "$work/greet.lua" \
  "http://127.0.0.1:$ingress/service/scope/other/call/Greeter/greet" > "$work/during.txt" &
calls=$!
sleep 1
cancel_started=$(date +%s.%N)
curl -s -X POST "http://127.0.0.1:$admin/invocations/bulk-cancel" -H 'content-type: application/json' \
  -d '{"scope":"held","statuses":["pending"]}' | python3 -c 'import json,sys; a=json.load(sys.stdin); print("canceled", a.get("cancelled"), "of", a.get("named"))'
cancel_done=$(date +%s.%N)
python3 -c "print(f'bulk cancel took {$cancel_done - $cancel_started:.2f} s')"
wait "$calls" || true
echo "calls in scope 'other' over 30 s around it:"
grep -E "50%|99%|Requests/sec|Non-2xx" "$work/during.txt"
echo "waiting after the cancel: $(waiting)"
