#!/usr/bin/env bash
# How fast a runaway plugin is stopped: loads the `hostile` test plugin looping forever as an
# extract plugin (default 10 ms deadline) and times calls answered 503 PLG0003, then checks an
# unaffected admin request. Release build; loopback only. Usage: proxy/benches/load/deadline.sh [calls]
set -euo pipefail
cd "$(dirname "$0")/../../.."
calls="${1:-50}"
# shellcheck source=common.sh
source proxy/benches/load/common.sh
cargo build -q --release --locked --target wasm32-wasip2 --manifest-path plugins/Cargo.toml --target-dir "$target_dir/plugins"
curl -sf -X PUT "http://127.0.0.1:$admin/plugins/hostile?hook=extract&config.behaviour=loop" \
  -H 'content-type: application/wasm' --data-binary "@$target_dir/plugins/wasm32-wasip2/release/hostile.wasm" >/dev/null
for _ in $(seq 1 "$calls"); do
  curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -X POST "http://127.0.0.1:$ingress/service/call/Greeter/greet" \
    -H 'content-type: application/json' -d '"x"'
done | sort -k2 -n | awk '{codes[$1]++; t[NR]=$2} END {
  for (c in codes) printf "status %s: %d calls\n", c, codes[c];
  p99 = int(NR * 0.99) + 1; if (p99 > NR) p99 = NR;
  printf "answered in: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", t[int(NR * 0.5) + 1] * 1000, t[p99] * 1000, t[NR] * 1000 }'
curl -sf "http://127.0.0.1:$admin/plugins/hostile" | python3 -c 'import json,sys; m=json.load(sys.stdin)["metrics"]; print("plugin metrics:", m)'
