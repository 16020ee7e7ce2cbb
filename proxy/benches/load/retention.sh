#!/usr/bin/env bash
# Store size under a steady load with retention on: calls Greeter/greet with wrk for SECONDS
# (default 600) while `worker.completion-retention` is RETENTION (default 1m), and prints the
# size of sluice.redb, the rows left in the store and the process's RSS every SAMPLE seconds
# (default 30). Usage: proxy/benches/load/retention.sh [connections] [seconds]
# PROFILE=debug uses the debug binaries already built (no release build).
set -euo pipefail
cd "$(dirname "$0")/../../.."
connections="${1:-8}"
seconds="${2:-600}"
sample="${SAMPLE:-30}"
export SERVICE_WORKER__COMPLETION_RETENTION="${RETENTION:-1m}"
# shellcheck source=common.sh
source proxy/benches/load/common.sh
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"load\""
wrk.headers["content-type"] = "application/json"
LUA
wrk -t2 -c"$connections" -d"${seconds}s" -s "$work/post.lua" "http://127.0.0.1:$ingress/Greeter/greet" > "$work/wrk.txt" &
load=$!
printf '%8s %12s %12s %10s\n' seconds store_bytes invocations rss_kib
start=$(date +%s)
while kill -0 "$load" 2>/dev/null; do
  rows=$(curl -sf "http://127.0.0.1:$admin/query" -H 'accept: application/json' -H 'content-type: application/json' \
    -d '{"query":"SELECT count(*) AS n FROM sys_invocation"}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["rows"][0]["n"])' || echo "?")
  printf '%8s %12s %12s %10s\n' "$(( $(date +%s) - start ))" "$(stat -c %s "$work/data/sluice.redb")" "$rows" \
    "$(awk '/VmRSS/ {print $2}' /proc/$server/status)"
  sleep "$sample"
done
wait "$load" || true
grep -E "Requests/sec|requests in" "$work/wrk.txt"
