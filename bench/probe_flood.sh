#!/usr/bin/env bash
# What a flood of health probes (or of any GET: P) costs the inference of a server with front ends: `linear` at
# c=32 (wrk, /predict) alone, then with 16 connections of GET /health_check beside it; each
# build in turn, ROUNDS times. Printed: inference req/s without and with the flood, the probes
# answered a second, and the CPU a probe costs the front ends and the device process (a flood
# alone, each process's user + system time from /proc).
#   bench/probe_flood.sh CHECKOUT...   (e.g. a `git worktree add /tmp/old <commit>`, and .)
# Env: F (--frontends, 2), ROUNDS (2), S (seconds a run, 5), PY (the Python, this checkout's
# .venv), PORT (8141), P (the path flooded, /health_check; e.g. /nothing, a 404, or /v2).
set -euo pipefail
F=${F:-2}; ROUNDS=${ROUNDS:-2}; S=${S:-5}; PORT=${PORT:-8141}; P=${P:-/health_check}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-$here/.venv/bin/python}
tmp=$(mktemp -d) && trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
echo '{"instances": [[1.0, 2.0, 3.0, 4.0]]}' > "$tmp/body.json"
echo 'wrk.method = "GET"' > "$tmp/get.lua"
export HF_HUB_OFFLINE=1 BATCHSERVE_GRPC_PORT=0 BENCH_BODY_FILE="$tmp/body.json"
url=http://127.0.0.1:$PORT
rate() { grep -o 'Requests/sec: *[0-9.]*' | awk '{printf "%.0f", $2}'; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
children_ticks() { local t=0 p; for p in $(pgrep -P "$1"); do t=$((t + $(ticks "$p"))); done; echo $t; }
for round in $(seq "$ROUNDS"); do
  for dir in "$@"; do
    (cd "$dir" && exec "$py" -m app serve --model linear --frontends "$F" --port "$PORT" \
       --log-level warning) > "$tmp/server.log" 2>&1 &
    server=$!
    until curl -sf "$url/health_check" > /dev/null; do
      kill -0 $server 2>/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
      sleep 0.5
    done
    sleep 2
    alone=$(wrk -t1 -c32 -d"${S}s" -s "$here/bench/post.lua" "$url/predict" | rate)
    wrk -t1 -c16 -d"${S}s" -s "$tmp/get.lua" "$url$P" > "$tmp/flood" &
    flood=$!
    beside=$(wrk -t1 -c32 -d"${S}s" -s "$here/bench/post.lua" "$url/predict" | rate)
    wait $flood
    d0=$(ticks $server) f0=$(children_ticks $server)
    probes=$(wrk -t1 -c16 -d"${S}s" -s "$tmp/get.lua" "$url$P" | rate)
    d1=$(ticks $server) f1=$(children_ticks $server)
    per=$((10000 / $(getconf CLK_TCK)))  # us a tick, times 100
    echo "round $round $dir: inference $alone req/s alone, $beside beside the flood" \
      "($(rate < "$tmp/flood") probes/s); a probe (flood alone, $probes/s):" \
      "front ends $(( (f1 - f0) * per * 100 / (probes * S) )) us," \
      "device process $(( (d1 - d0) * per * 100 / (probes * S) )) us"
    kill $server; wait $server || true
  done
done
