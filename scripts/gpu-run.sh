#!/usr/bin/env bash
# Everything that needs the GPU, in one go (for the device machine; see README "GPU runs").
# Expects samples/build/ (built with clang elsewhere) and, where packages are missing,
# wheels in .whl/. Logs and results go to $OUT (default ./gpu-out).
set -uo pipefail
source "$(dirname "$0")/../bench/gpu-env.sh"   # $OUT, wheels, PYTHONPATH, bytecode
python3 -m proteus_rewrite.inject.shim > "$OUT/shim-build.log" 2>&1 || { cat "$OUT/shim-build.log"; exit 1; }
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest-gpu.log" | tail -40 || status=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 bench/shim_bench.py --results "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -45 || status=1
fi
exit $status
