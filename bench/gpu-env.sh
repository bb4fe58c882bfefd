# Sourced by the GPU scripts (scripts/gpu-run.sh, bench/gpu-*.sh): the README's install, as a
# user makes it, on a machine that reaches no package index: `make venv` from requirements.lock
# with the wheels carried in .whl/ (or its subfolders, when they travel in parts: `make wheels`
# fills .whl/ here), no apt step. Then $OUT, and the GPU's state for the record.
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
wheels=$(ls -d .whl/*/ 2>/dev/null | tr '\n' ' ')
make venv WHEELS="${wheels:-.whl}" SYSTEM_DEPS=0 > "$OUT/install.log" 2>&1 || { tail -30 "$OUT/install.log"; exit 1; }
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1
