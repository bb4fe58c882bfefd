#!/usr/bin/env bash
# The specialization-policy benchmark (bench/policy_bench.py) on a GPU machine, in one go.
# Expects samples/build/ and bench/apps/build/ (built elsewhere by samples/build.py and
# bench/apps/build.py) and, where packages are missing, wheels in .whl/. Results (JSON,
# markdown) and the log go to $OUT (default ./gpu-out); extra arguments go to policy_bench.py.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1
python3 bench/policy_bench.py --out "$OUT" "$@" 2>&1 | tee "$OUT/policy.log" | tail -40
exit "${PIPESTATUS[0]}"
