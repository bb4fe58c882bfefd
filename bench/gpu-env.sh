# Sourced by bench/gpu-suite.sh and bench/gpu-policy.sh: $OUT, the wheels in .whl/ (where a
# package is missing on the GPU machine), PYTHONPATH and the GPU's state for the record.
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
