#!/usr/bin/env bash
# One GPU session's work, in stages that fit the device tool's calls (each under 10 minutes;
# the payloads built here travel in .gpu/, carried by the calls). Every stage writes to $OUT
# as it goes, so a stage cut short keeps what it finished.
#
#   bench/gpu-session.sh tests     the README's install (bench/gpu-env.sh), the GPU tests, and
#                                  beside them upstream Proteus's tests/gpu programs
#                                  (bench/corpora/upstream_tests) natively and under the tool
#   bench/gpu-session.sh nvcc      the nvcc corpora under the PTX route, CUPTI-traced: the
#                                  cuda-samples (.gpu/cuda-samples.tar.xz) and a SHARD (I/N) of
#                                  HeCBench's nvcc builds (.gpu/hecbench-nvcc.tar.xz) in three
#                                  modes; SPEED=N instead times N native/warm pairs per program;
#                                  CHECK_COST=1 adds a cold run without the default check;
#                                  COST=N times the check instead (N cold runs a side, -j 1);
#                                  CLANG=1 runs the clang builds (.gpu/hecbench-clang.tar.xz) instead
#   bench/gpu-session.sh compare   the paper's six programs: plain, ours, Proteus
#                                  (bench/proteus_compare.py), alone on the GPU; PHASE=cold, then
#                                  PHASE=warm with one CACHE_DIR, for a program that outlasts a call
#   bench/gpu-session.sh hunt      a rare crash's evidence: bench/crash_hunt.py's cold runs of one
#                                  nvcc-built HeCBench program, the shim built with AddressSanitizer
set -uo pipefail
stage=${1:?usage: gpu-session.sh tests|nvcc|compare|hunt}
export OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
# .gpu/commit first: the device copy's .git can be older than the tree it carries
export PROTEUS_COMMIT=${PROTEUS_COMMIT:-$(cat .gpu/commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)}
# The device tool brings back a few files only: at exit, everything in one archive.
pack() { (cd "$OUT" && tar -cJf /tmp/results.tar.xz --exclude=results.tar.xz . && find . -mindepth 1 -delete && mv /tmp/results.tar.xz .); }
trap pack EXIT
kernel_trace_lib() {   # the CUPTI injection library the GPU tests use, built once here
  mkdir -p /tmp/cupti
  python -c "from bench.lib import cupti; print(cupti.injection_library('/tmp/cupti'))" 2>>"$OUT/cupti.log"
}

case $stage in
tests)
  [ -d samples/build/loop_count ] || tar -xJf .gpu/samples.tar.xz -C samples
  source bench/gpu-env.sh || exit 1
  mkdir -p /tmp/cupti
  lib=$(kernel_trace_lib)
  if [ -f .gpu/upstream-tests.tar.xz ]; then   # beside the tests: correctness only, no timing
    mkdir -p /tmp/ut && tar -xJf .gpu/upstream-tests.tar.xz -C /tmp/ut
    # the runner as committed, on the tarball's programs.json and builds (what it is carried for)
    ut=$(dirname "$(find /tmp/ut -name programs.json -path '*upstream_tests*' | head -1)")
    (timeout 480 python -m bench.corpora.upstream_tests.run --work "$ut/work" --programs "$ut/programs.json" -j 6 \
       --tool "$PWD/.venv/bin/proteus-rewrite" ${lib:+--kernel-trace-lib "$lib"} \
       --out "$OUT/upstream-tests" > "$OUT/upstream-tests.log" 2>&1) &
  fi
  timeout 500 python -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/pytest-gpu.log" 2>&1
  echo "pytest exit $?" >> "$OUT/pytest-gpu.log"
  wait
  tail -25 "$OUT/pytest-gpu.log"; tail -5 "$OUT/upstream-tests.log" 2>/dev/null
  ;;
nvcc)
  [ -x .venv/bin/proteus-rewrite ] || source bench/gpu-env.sh || exit 1
  export PATH="$PWD/.venv/bin:$PATH"
  root=$PWD
  lib=$(kernel_trace_lib)
  mkdir -p /tmp/cs /tmp/hb
  if [ -f .gpu/cuda-samples.tar.xz ] && [ "${SAMPLES:-1}" = 1 ]; then
    tar -xJf .gpu/cuda-samples.tar.xz -C /tmp/cs
    (cd /tmp/cs && timeout 200 python3 -m bench.corpora.cuda_samples.run --tool "$root/.venv/bin/proteus-rewrite" \
       ${lib:+--kernel-trace "$lib"} --out "$OUT/cuda-samples" > "$OUT/cuda-samples.log" 2>&1)
    rm -rf "$OUT/cuda-samples/scratch"
  fi
  # CLANG=1: the clang builds (.gpu/hecbench-clang.tar.xz, HeCBench's recommended recipe) in place of the nvcc ones
  recipe=nvcc
  [ "${CLANG:-0}" = 1 ] && recipe=recommended
  tarball=.gpu/hecbench-$([ "$recipe" = nvcc ] && echo nvcc || echo clang).tar.xz
  tar -xJf "$tarball" -C /tmp/hb
  # the runner as committed, over the one the tarball was packed with (the builds are what it is carried for)
  cp bench/corpora/hecbench/run.py bench/corpora/hecbench/corpus.py /tmp/hb/bench/corpora/hecbench/
  cp bench/lib/harness.py /tmp/hb/bench/lib/
  if [ "${SPEED:-0}" -gt 0 ]; then speed=(-j 1 --modes default-cold,default-warm --speed-reps "$SPEED"); else speed=(-j 5); fi
  # COST=N: the default check's cost, N untraced cold runs a side, alone on the GPU (COST_WITH: a third side's settings)
  if [ "${COST:-0}" -gt 0 ]; then
    speed=(-j 1 --modes default-cold --check-cost-reps "$COST")
    for kv in ${COST_WITH:-}; do speed+=(--check-cost-with "$kv"); done
  fi
  (cd /tmp/hb && timeout "${HEC_S:-480}" python3 -m bench.corpora.hecbench.run --recipes "$recipe" "${speed[@]}" --timeout 120 \
     --tool "$root/.venv/bin/proteus-rewrite" ${lib:+--kernel-trace "$lib"} --shard "${SHARD:-1/1}" ${ONLY:+--only "$ONLY"} \
     ${CHECK_COST:+--check-cost} ${MODES:+--modes "$MODES"} \
     --out "$OUT/hecbench-$recipe" > "$OUT/hecbench-$recipe.log" 2>&1)
  rm -rf "$OUT/hecbench-$recipe/scratch"
  tail -3 "$OUT/cuda-samples.log" 2>/dev/null; grep -E "^- $recipe" "$OUT/hecbench-$recipe/hecbench-corpus.md"
  ;;
compare)   # NVCC=1: also the nvcc builds (hec/PROG/main_nvcc), natively and under the tool (--nvcc);
           # PTX=1: also main_all on the PTX route (PROTEUS_CODE_KIND=ptx when rewriting), beside ours (--ptx-route)
  export PATH="$PWD/.venv/bin:$PATH"
  mkdir -p /tmp/h /tmp/pu
  # unpacked again when the tarball differs from the one unpacked (a warm machine keeps /tmp)
  cmp -s .gpu/hec6.tar.xz /tmp/h/hec6.tar.xz || { rm -rf /tmp/h/hec && tar -xJf .gpu/hec6.tar.xz -C /tmp/h && cp .gpu/hec6.tar.xz /tmp/h/; }
  cmp -s .gpu/bundle.tar.xz /tmp/pu/bundle.tar.xz \
    || { rm -rf /tmp/pu/proteus-upstream && tar -xJf .gpu/bundle.tar.xz -C /tmp/pu && cp .gpu/bundle.tar.xz /tmp/pu/; }
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1
  lib=$(kernel_trace_lib)
  python -m bench.proteus_compare --hec /tmp/h/hec --proteus /tmp/pu/proteus-upstream --tool "$PWD/.venv/bin/proteus-rewrite" \
    --out "$OUT/compare" --budget-s "${BUDGET_S:-330}" --grace-s "${GRACE_S:-90}" --timeout "${RUN_TIMEOUT:-90}" --hecbench-commit "${HECBENCH_COMMIT:-unknown}" \
    ${lib:+--kernel-trace-lib "$lib"} ${PROGRAMS:+--programs $PROGRAMS} ${ALT:+--alt $ALT} ${EXTRA:+--extra $EXTRA} \
    ${PHASE:+--phase $PHASE} ${CACHE_DIR:+--cache-dir $CACHE_DIR} ${REPS:+--reps $REPS} ${COLD_REPS:+--cold-reps $COLD_REPS} ${GPU_ROUNDS:+--gpu-time-rounds $GPU_ROUNDS} \
    $([ "${NVCC:-0}" = 1 ] && echo --nvcc) $([ "${PTX:-0}" = 1 ] && echo --ptx-route)
  # KEEP_CACHE=1: both JITs' caches come back (their cubins, to compare the code offline)
  [ "${KEEP_CACHE:-0}" = 1 ] || rm -rf "$OUT/compare/cache"
  rm -rf "$OUT/compare/rewritten"
  cat "$OUT/compare/proteus-compare.md"
  ;;
hunt)   # bench/crash_hunt.py on one nvcc-built HeCBench program (.gpu/hecbench-nvcc.tar.xz): PROGRAM
        # (lulesh), RUNS (40) cold runs, JOBS (2) at a time, ASAN=1 (the default) with the shim
        # built with AddressSanitizer
  [ -x .venv/bin/proteus-rewrite ] || source bench/gpu-env.sh || exit 1
  export PATH="$PWD/.venv/bin:$PATH"
  mkdir -p /tmp/hb
  [ -d /tmp/hb/bench/corpora/hecbench/work ] || tar -xJf .gpu/hecbench-nvcc.tar.xz -C /tmp/hb
  prog=${PROGRAM:-lulesh}
  w=/tmp/hb/bench/corpora/hecbench/work/build/nvcc/$prog
  mapfile -d '' -t args < <(python3 -c "import json, sys
d = json.load(open('/tmp/hb/bench/corpora/hecbench/programs.json'))
a = next(p['args'] for p in d['programs'] if p['name'] == sys.argv[1])
sys.stdout.write(''.join(x + chr(0) for x in a))" "$prog")
  rm -rf /tmp/hunt-tool
  proteus-rewrite "$w/main" -o /tmp/hunt-tool > "$OUT/hunt-rewrite.log" 2>&1 || { tail -3 "$OUT/hunt-rewrite.log"; exit 1; }
  timeout "${HUNT_S:-500}" python -m bench.crash_hunt --tool-dir /tmp/hunt-tool --runs "${RUNS:-40}" --jobs "${JOBS:-2}" \
    $([ "${ASAN:-1}" = 1 ] && echo --asan) --cwd "$w" --out "$OUT/hunt" -- "$w/main" "${args[@]}" 2> "$OUT/hunt.log"
  cat "$OUT/hunt/crash-hunt.md"
  ;;
*) echo "gpu-session.sh: unknown stage '$stage' (tests, nvcc, compare, hunt)" >&2; exit 2 ;;
esac
