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
# Bytecode, as an installed Python has it: the shim starts a Python inside every app run, and
# this machine's packages may lack .pyc files where it cannot write them (each run would then
# compile them from source again). They go to one writable tree, filled once here.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=/tmp/pycache
python3 - <<'PY' >/dev/null 2>&1
import compileall, importlib.util, os, re, sysconfig
dirs = [sysconfig.get_paths()["stdlib"], "proteus_rewrite", "/tmp/site"]
for name in ("llvmlite", "cuda", "click", "rich", "platformdirs", "filelock", "msgpack"):
    spec = importlib.util.find_spec(name)
    dirs += list(spec.submodule_search_locations or []) if spec else []
skip = re.compile(r"/(test|tests|idlelib|tkinter|lib2to3|ensurepip|turtledemo)/")
for d in dirs:
    if os.path.isdir(d):
        compileall.compile_dir(d, quiet=2, workers=0, rx=skip)
PY
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/nvidia-smi.csv" 2>&1
