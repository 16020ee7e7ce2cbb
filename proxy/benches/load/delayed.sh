#!/usr/bin/env bash
# Memory of delayed sends: COUNT (default 100,000) sends of SIZE bytes (default 10 KiB) with
# `?delay=1h` through Sluice, then its RSS against idle. Delayed sends rest with their input in
# the store only, so the growth is their compact records and timers, not their inputs.
# Usage: proxy/benches/load/delayed.sh [count] [size]; PROFILE=debug uses the debug binaries.
set -euo pipefail
cd "$(dirname "$0")/../../.."
count="${1:-100000}"
size="${2:-10240}"
# shellcheck source=common.sh
source proxy/benches/load/common.sh
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }
before=$(rss)
python3 - "$ingress" "$count" "$size" <<'PY'
import http.client, sys, threading, time
port, count, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
body = ('"' + 'x' * (size - 2) + '"').encode()
threads, done, failed = 8, [0], [0]
lock = threading.Lock()
def work(n):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(n):
        conn.request("POST", "/service/send/Greeter/greet?delay=1h", body, {"content-type": "application/json"})
        resp = conn.getresponse(); resp.read()
        with lock:
            done[0] += 1
            failed[0] += resp.status != 202
start = time.time()
ts = [threading.Thread(target=work, args=(count // threads + (i < count % threads),)) for i in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print(f"{done[0]} delayed sends of {size} B in {time.time() - start:.1f} s, {failed[0]} not 202")
PY
sleep 2
after=$(rss)
echo "sluice RSS: ${before} kB idle, ${after} kB with ${count} delayed sends: +$(( (after - before) / 1024 )) MiB, $(( (after - before) * 1024 / count )) B each"
echo "store: $(( $(stat -c %s "$work/data/sluice.redb") / 1048576 )) MiB"
