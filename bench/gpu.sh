#!/usr/bin/env bash
# The GPU run, in one command on a lent GPU machine (docs/benchmarks.md, "GPU"): the tests with
# CUDA present, then the sweep on mlp and minilm with GPU-sized batches and SM utilisation.
# Needs .carry/ from `python -m bench.carry` (made here, named in the device call's carry).
#
#   on the device:  bash bench/gpu.sh            (logs and result JSON go to $OUT)
#   dry run here:   INSTALL=0 PY=.venv/bin/python DEVICES=cpu OUT=/tmp/gpu bash bench/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DEVICES=${DEVICES:-cuda}
SECONDS_PER_POINT=${SECONDS_PER_POINT:-5}
OUT=${OUT:?OUT: where the logs and results go}
mkdir -p "$OUT"

export PYTHONPATH=$PWD/.carry/site:$PWD
if [ "${INSTALL:-1}" = 1 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .carry/whl/*.whl 2>&1 | tee "$OUT/install.log" || exit 1
  PYTHONPATH=/tmp/site:$PYTHONPATH
fi
export PATH=$PWD/.carry/bin:$PATH LD_LIBRARY_PATH=$PWD/.carry/lib HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

sweep() {  # workload, max batch, concurrencies, extra flags
  echo "== sweep $1, max batch $2, concurrency $3 ${4:-}"
  rm -rf /tmp/results
  # shellcheck disable=SC2086 # $4: extra flags, word-split on purpose
  timeout 140 "$PY" -m bench --devices "$DEVICES" --workload "$1" --max-batch-size "$2" \
    --concurrency "$3" --seconds "$SECONDS_PER_POINT" --out /tmp/results ${4:-}
  echo "== sweep exit $?"
  cp /tmp/results/*.json "$OUT/" 2>/dev/null
}

main() {
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv
  "$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.cuda.is_available())'

  echo "== tests (unit and API; the server's default devices are auto, so CUDA where present)"
  # The MiniLM weights travel stored as float16 (bench/carry.py): sentence-transformers would
  # compute in float16 from them, so the parity test against it is left to CI.
  timeout 150 "$PY" -m pytest -q -p no:cacheprovider -W default --continue-on-collection-errors \
    --junitxml="$OUT/tests.xml" tests/unit tests/api \
    --deselect tests/unit/models/test_minilm.py::test_minilm_matches_sentence_transformers
  echo "== tests exit $?"

  sweep mlp 256 1,2,8,64,256
  sweep mlp 256 1,8,64 "--instances 32 --configs batchserve"
  sweep minilm 128 1,2,8,64,256
}

main 2>&1 | tee "$OUT/gpu.log"
