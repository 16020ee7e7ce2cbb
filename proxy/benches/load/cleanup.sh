#!/usr/bin/env bash
# A retention sweep against live calls: fills the store with completed invocations (durable
# sends of Greeter/greet for FILL seconds, default 40), waits until they have all run, measures
# calls in another scope for MEASURE seconds (default 20) as a baseline, then again while their
# retention (RETENTION, default 300s) ends and the purgers sweep them, and prints both and how
# many were purged meanwhile. SERVICE_WORKER__CLEANUP_MAX_IN_FLIGHT sets the pace (default 32;
# 1000 purges as fast as one read allows, as before the setting existed).
# Usage: proxy/benches/load/cleanup.sh [connections]
set -euo pipefail
cd "$(dirname "$0")/../../.."
connections="${1:-16}"
fill="${FILL:-40}"
measure="${MEASURE:-20}"
retention="${RETENTION:-300s}"
export SERVICE_WORKER__COMPLETION_RETENTION="$retention"
# shellcheck source=common.sh
source proxy/benches/load/common.sh
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
# How many invocations `WHERE …` $1 selects; `?` when the query is refused (a timeout while the
# store is busy).
count() {
  curl -s "http://127.0.0.1:$admin/query" -H 'accept: application/json' -H 'content-type: application/json' \
    -d "{\"query\":\"SELECT count(*) AS n FROM sys_invocation $1\"}" |
    python3 -c 'import json,sys
try: print(json.load(sys.stdin)["rows"][0]["n"])
except Exception: print("?")'
}
started=$(date +%s)
wrk -t2 -c"$connections" -d"${fill}s" -s "$work/post.lua" "http://127.0.0.1:$ingress/Greeter/greet/send" | grep -E "requests in|Requests/sec"
while [ "$(count "WHERE status != 'completed'")" != 0 ]; do sleep 2; done
filled=$(count "")
echo "completed invocations in the store: $filled (all run $(( $(date +%s) - started )) s after the fill began)"
other="http://127.0.0.1:$ingress/service/scope/other/call/Greeter/greet"
echo "== baseline: other-scope calls, no sweep"
wrk -t2 -c"$connections" -d"${measure}s" --latency -s "$work/post.lua" "$other" | grep -E "requests in|Requests/sec|  50%|  99%"
due=$(( started + ${retention%s} + 5 ))
while [ "$(date +%s)" -lt "$due" ]; do sleep 1; done
# The fill's invocations only: the measured calls (scope `other`) are kept too.
before=$(count "WHERE scope IS NULL")
cpu_before=$(cpu_seconds "$server")
echo "== during the sweep (cleanup-max-in-flight ${SERVICE_WORKER__CLEANUP_MAX_IN_FLIGHT:-32})"
wrk -t2 -c"$connections" -d"${measure}s" --latency -s "$work/post.lua" "$other" | grep -E "requests in|Requests/sec|  50%|  99%"
after=$(count "WHERE scope IS NULL")
echo "store before/after the measured sweep: $before/$after of $filled; sluice CPU $(python3 -c "print(round($(cpu_seconds "$server") - $cpu_before, 1))") s"
curl -sf "http://127.0.0.1:$admin/metrics" | grep -E '^sluice_cleaner_purge_delay_seconds_(count|sum)' || true
