#!/usr/bin/env bash
# The benchmark suite on a GPU machine, in one go (see bench/README.md). Expects
# bench/corpora/apps/build/ (built elsewhere by `python -m bench.corpora.apps.build`) and, where
# packages are missing, wheels in .whl/. Results (JSON, markdown) and the log go to $OUT
# (default ./gpu-out); extra arguments go to bench/run.py.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python -m bench.run --out "$OUT" "$@" 2>&1 | tee "$OUT/run.log" | tail -70
exit "${PIPESTATUS[0]}"
