#!/usr/bin/env bash
# Everything that needs the GPU, in one go, from the README's install (bench/gpu-env.sh).
# Expects samples/build/ (built with clang elsewhere) and the locked wheels in .whl/.
# Logs and results go to $OUT (default ./gpu-out).
set -uo pipefail
source "$(dirname "$0")/../bench/gpu-env.sh"
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest-gpu.log" | tail -40 || status=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python -m bench.shim_bench --results "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -45 || status=1
fi
exit $status
