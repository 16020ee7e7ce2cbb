#!/usr/bin/env bash
# Hostile-client soak: while normal calls run, 10,000 hostile connections come from three other
# loopback addresses (127.0.0.2-4): attaches to a send due in a year whose clients close at once,
# slowloris clients that trickle header bytes, and silent clients that connect and send nothing.
# Reports the normal calls' latency (p50/p99) and errors, the hostile connections' fate, and
# checks that every acknowledged send ran (one counter counts them: nothing lost). Release build; loopback only.
# Usage: proxy/benches/load/soak.sh [seconds] [hostile-connections]
set -euo pipefail
cd "$(dirname "$0")/../../.."
seconds="${1:-30}"
hostile="${2:-10000}"
# shellcheck source=common.sh
source proxy/benches/load/common.sh
far=$(curl -sf -X POST "http://127.0.0.1:$ingress/service/send/Greeter/greet?delay=8760h" \
  -H 'content-type: application/json' -d '"far"' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["invocationId"])')
cat > "$work/hostile.py" <<'PY'
import asyncio, sys, time
port, far, total, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
sources = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
kinds = ["attach", "slowloris", "silent"]
fate = {k: {"opened": 0, "refused": 0, "closed_by_server": 0, "open_at_end": 0} for k in kinds}
end = time.monotonic() + seconds

async def one(i):
    kind, source = kinds[i % 3], sources[i % 3]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError:
        fate[kind]["refused"] += 1
        return
    fate[kind]["opened"] += 1
    try:
        if kind == "attach":
            writer.write(f"GET /service/attach/{far} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            await writer.drain()
            writer.close()
            return
        if kind == "slowloris":
            writer.write(b"GET /service/health HTTP/1.1\r\n")
            while time.monotonic() < end:
                writer.write(b"x-a: b\r\n")
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1), 2) == b"":
                        fate[kind]["closed_by_server"] += 1
                        return
                except asyncio.TimeoutError:
                    pass
        else:
            try:
                left = max(end - time.monotonic(), 0.1)
                if await asyncio.wait_for(reader.read(1), left) == b"":
                    fate[kind]["closed_by_server"] += 1
                    return
            except asyncio.TimeoutError:
                pass
        fate[kind]["open_at_end"] += 1
    except (ConnectionError, OSError):
        fate[kind]["closed_by_server"] += 1
    finally:
        writer.close()

async def main():
    tasks = []
    pause = seconds / 2 / total  # all opened in the first half of the run
    for i in range(total):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(pause)
    await asyncio.gather(*tasks)
    for kind in kinds:
        print(f"hostile {kind}: {fate[kind]}")

asyncio.run(main())
PY
cat > "$work/send.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "\"soak\""
wrk.headers["content-type"] = "application/json"
LUA
ulimit -n "$(ulimit -Hn)"
cpu_before=$(cpu_seconds "$server")
python3 "$work/hostile.py" "$ingress" "$far" "$hostile" "$seconds" > "$work/hostile.out" &
attacker=$!
echo "== normal calls for ${seconds} s beside ${hostile} hostile connections"
wrk -t1 -c8 -d"${seconds}s" --latency -s "$work/send.lua" \
  "http://127.0.0.1:$ingress/service/call/Greeter/greet" > "$work/calls.out"
grep -E "50%|99%|requests in|Requests/sec|Non-2xx|Socket errors" "$work/calls.out"
echo "== normal sends beside them: each adds 1 to one counter, so none may be lost"
cat > "$work/add.lua" <<'LUA'
wrk.method = "POST"
wrk.body = "1"
wrk.headers["content-type"] = "application/json"
LUA
wrk -t1 -c4 -d5s -s "$work/add.lua" \
  "http://127.0.0.1:$ingress/Counter/soak/add/send" > "$work/sends.out"
grep -E "requests in|Non-2xx|Socket errors" "$work/sends.out"
wait "$attacker"
cat "$work/hostile.out"
cpu_after=$(cpu_seconds "$server")
answered=$(awk '/requests in/ {print $1}' "$work/sends.out")
refused=$(awk '/Non-2xx/ {print $NF}' "$work/sends.out")
acknowledged=$((answered - ${refused:-0}))
counted=0
for _ in $(seq 1 600); do
  counted=$(curl -sf -X POST "http://127.0.0.1:$ingress/Counter/soak/get")
  [ "$counted" -ge "$acknowledged" ] 2>/dev/null && break
  sleep 0.1
done
# wrk stops with a few sends in flight: their adds may count without their 202 being counted.
echo "sends acknowledged: $acknowledged; counted by the object: $counted"
echo "sluice CPU during the soak: $(python3 -c "print(f'{$cpu_after - $cpu_before:.1f}')") s"
[ "$counted" -ge "$acknowledged" ] || { echo "LOST: $((acknowledged - counted)) acknowledged sends" >&2; exit 1; }
