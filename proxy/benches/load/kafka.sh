#!/usr/bin/env bash
# Kafka end to end: a topic on an out-of-process Kafka-protocol broker (kcat hosting librdkafka's
# mock cluster) is filled with records first, then a subscription turns them into invocations of
# `Greeter/greet`; reports records/s from subscription to the last completed invocation, and RSS.
# Release build; loopback only. Needs kcat (apt-get install kcat).
# Usage: proxy/benches/load/kafka.sh [records]   (the mock broker creates the topic with 4 partitions)
set -euo pipefail
cd "$(dirname "$0")/../../.."
records="${1:-50000}"
command -v kcat >/dev/null || { echo "needs kcat (apt-get install kcat)" >&2; exit 1; }
# shellcheck source=common.sh
source proxy/benches/load/common.sh
# The broker: kcat hosts a mock cluster and logs its address; the consumer it runs is idle.
kcat -X test.mock.num.brokers=1 -b mock -C -t idle \
  -d mock >"$work/broker.log" 2>&1 &
broker=$!
trap 'kill "$broker" 2>/dev/null; kill -TERM "$server" 2>/dev/null; kill "$dep" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
bootstrap=$(bootstrap_in "$work/broker.log")
echo "== broker $bootstrap; producing $records records"
seq 1 "$records" | sed 's/.*/"r&"/' | kcat -P -b "$bootstrap" -t records -X linger.ms=20
curl -sf -X POST "http://127.0.0.1:$admin/kafka-clusters" -H 'content-type: application/json' \
  -d "{\"name\":\"bench\",\"properties\":{\"bootstrap.servers\":\"$bootstrap\"}}" >/dev/null
count() {
  curl -sf -X POST "http://127.0.0.1:$admin/query" -H 'accept: application/json' \
    -H 'content-type: application/json' \
    -d '{"query":"SELECT count(*) AS n FROM sys_invocation WHERE status = '"'"'completed'"'"'"}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["rows"][0]["n"])'
}
start=$(date +%s.%N)
curl -sf -X POST "http://127.0.0.1:$admin/subscriptions" -H 'content-type: application/json' \
  -d '{"source":"kafka://bench/records","sink":"service://Greeter/greet"}' >/dev/null
done_count=0
while [ "$done_count" -lt "$records" ]; do
  sleep 0.5
  done_count=$(count)
done
end=$(date +%s.%N)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$server/status")
python3 -c "
elapsed = $end - $start
print(f'{$records} records -> {$done_count} completed invocations in {elapsed:.1f} s: {$records / elapsed:,.0f} records/s; sluice RSS {$rss // 1024} MB')"
