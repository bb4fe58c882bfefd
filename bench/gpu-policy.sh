#!/usr/bin/env bash
# The specialization-policy benchmark (bench/policy_bench.py) on a GPU machine, in one go.
# Expects samples/build/ and bench/corpora/apps/build/ (built elsewhere by samples/build.py and
# `python -m bench.corpora.apps.build`) and, where packages are missing, wheels in .whl/. Results
# (JSON, markdown) and the log go to $OUT (default ./gpu-out); extra arguments go to policy_bench.py.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
python -m bench.policy_bench --out "$OUT" "$@" 2>&1 | tee "$OUT/policy.log" | tail -40
exit "${PIPESTATUS[0]}"
