# The two set-up commands of the README:
#   make demo   install, build the samples, record each one with proteus-rewrite (and run
#               them on the GPU when one is present)
#   make test   install, build the samples, run the test suite (what .ci/run calls)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARCH ?= sm_90

.PHONY: demo test samples install bench clean

$(VENV)/.installed: pyproject.toml scripts/install-deps
	scripts/install-deps
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

samples: install
	$(PY) samples/build.py --arch $(ARCH)
	$(PY) samples/build_hip.py

demo: samples
	$(PY) scripts/demo.py --arch $(ARCH)

test: samples
	$(PY) -m pytest

# CPU benchmarks; the GPU ones run through scripts/gpu-run.sh on a machine with a GPU
bench: samples
	$(PY) bench/extract_bench.py
	$(PY) bench/specialize_bench.py
	$(PY) bench/cache_bench.py
	$(PY) bench/hitpath_bench.py
	$(PY) bench/exit_cost.py
	$(PY) bench/miss_bench.py

clean:
	rm -rf samples/build proteus-out bench/work .pytest_cache
