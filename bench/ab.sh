#!/usr/bin/env bash
# A/B two builds side by side: both servers up at once (core 0), alternating 3 s wrk runs
# (core 1), then the per-pair ratios of requests/s and their median, and each build's event-loop
# CPU per request (its main thread's, from /proc): the finer measure of a small change.
#   bench/ab.sh OLD_CHECKOUT NEW_CHECKOUT   (e.g. a `git worktree add /tmp/old <commit>`)
# Env: C (concurrency, 64), N (pairs, 6), W (workload, linear), D (--devices, cpu), F
# (--frontends, 1; above 1 the loop CPU is the device process's), OLD_F / NEW_F (one side's
# --frontends instead of F; set empty, that side gets no flag: its default, or a build without
# the setting), BODY (the request body), URL_PATH (/predict; /v2/models/$W/infer for v2 JSON),
# PY (the Python, this checkout's .venv; OLD_PY / NEW_PY one side's: two Pythons on one build,
# bench/py312.sh for Ubuntu 24.04's), PIN (1; 0 leaves servers and wrk unpinned, as `python -m
# bench` runs them: then the event loop and the device thread of a server run on different
# cores at once), LOG (--log-level, warning; info: an access line a request, each
# server's log read through a pipe, as a container's is), TREE (0; 1: the CPU of every process
# of each server, its front ends too, not its main thread's: "loop us" is then the server's).
set -euo pipefail
# shellcheck disable=SC2034  # both read as ${!side}
old=$(realpath "$1") new=$(realpath "$2")
C=${C:-64}; N=${N:-6}; W=${W:-linear}; D=${D:-cpu}; F=${F:-1}; PIN=${PIN:-1}; LOG=${LOG:-warning}
TREE=${TREE:-0}
OLD_F=${OLD_F-$F}; NEW_F=${NEW_F-$F}; URL_PATH=${URL_PATH:-/predict}
server_cpu=(taskset -c 0); wrk_cpu=(taskset -c 1)
[ "$PIN" = 1 ] || { server_cpu=(); wrk_cpu=(); }
BODY=${BODY:-'{"instances": [[1.0, 2.0, 3.0, 4.0]]}'}
absolute() {  # a path to a program, absolute (the servers cd); a bare name as it is
  case $1 in */*) echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")";; *) echo "$1";; esac
}
py=$(absolute "${PY:-"$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python"}")
OLD_PY=$(absolute "${OLD_PY:-$py}"); NEW_PY=$(absolute "${NEW_PY:-$py}")
lua=$(realpath "$(dirname "$0")/post.lua")
tmp=$(mktemp -d) && trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
echo "$BODY" > "$tmp/body.json"
export HF_HUB_OFFLINE=1 BENCH_BODY_FILE="$tmp/body.json" BATCHSERVE_GRPC_PORT=0  # HTTP only
declare -A pid
for side in old new; do
  dir=${!side}; port=$([ $side = old ] && echo 8101 || echo 8102)
  f=$([ $side = old ] && echo "$OLD_F" || echo "$NEW_F")
  side_py=$([ $side = old ] && echo "$OLD_PY" || echo "$NEW_PY")
  (cd "$dir" && exec "${server_cpu[@]}" "$side_py" -m app serve --model "$W" --devices "$D" \
     --port "$port" --log-level "$LOG" --torch-threads 1 ${f:+--frontends "$f"}) \
     > >(cat > "$tmp/$side.log") 2>&1 &
  pid[$port]=$!
done
loop_ticks() {  # user + system: the main thread's, or with TREE=1 every process's of the server
  if [ "$TREE" = 1 ]; then
    # shellcheck disable=SC2046  # the server and its children's pids, word-split on purpose
    awk '{t += $14 + $15} END {print t}' $(printf '/proc/%s/stat ' "$1" $(pgrep -P "$1"))
  else
    awk '{print $14 + $15}' "/proc/$1/task/$1/stat"
  fi
}
for port in 8101 8102; do
  until curl -sf "localhost:$port/health_check" >/dev/null; do
    kill -0 "${pid[$port]}" 2>/dev/null || { cat "$tmp"/*.log >&2; exit 1; }  # it did not start
    sleep 0.5
  done
done
for _ in $(seq "$N"); do
  for port in 8101 8102; do
    before=$(loop_ticks "${pid[$port]}")
    out=$("${wrk_cpu[@]}" wrk -t1 -c"$C" -d3s -s "$lua" "http://127.0.0.1:$port$URL_PATH" \
      | grep BENCH_JSON)
    echo "$port $(($(loop_ticks "${pid[$port]}") - before)) $out"
  done
done | TICK_S=$(getconf CLK_TCK) "$py" -c "
import json, os, statistics as st, sys
runs = {}
for line in sys.stdin:
    port, ticks, rest = line.split(' ', 2)
    j = json.loads(rest.split('BENCH_JSON ')[1])
    loop_us = int(ticks) / int(os.environ['TICK_S']) / max(j['requests'], 1) * 1e6
    ok = j['requests'] - j['http_errors']  # a refusal is not throughput
    runs.setdefault(port, []).append((ok / j['duration_us'] * 1e6, j['p50_us'], j['http_errors'], loop_us))
old, new = runs['8101'], runs['8102']
if not all(x[0] for x in old + new):
    sys.exit('ab.sh: a run had no answer without an error (is BODY right for W?)')
ratios = [b[0] / a[0] for a, b in zip(old, new)]
print('old req/s', [round(x[0]) for x in old]); print('new req/s', [round(x[0]) for x in new])
print('ratios', [round(r, 3) for r in ratios], 'median', round(st.median(ratios), 3))
print('p50 us old/new', st.median(x[1] for x in old), st.median(x[1] for x in new),
      'http errors', sum(x[2] for x in old), sum(x[2] for x in new))
print('loop us/request old', [round(x[3]) for x in old], 'median', round(st.median(x[3] for x in old)))
print('loop us/request new', [round(x[3]) for x in new], 'median', round(st.median(x[3] for x in new)))
"
