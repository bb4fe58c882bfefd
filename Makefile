# The two set-up commands of the README:
#   make demo   install, build the samples, record each one with proteus-rewrite (and run
#               them on the GPU when one is present)
#   make test   install, check the code (make lint), build the samples, run the test suite
#               (what .ci/run calls)
#
# Python packages come from requirements.lock (pinned, with hashes) into $(VENV). Where no
# package index is reachable (a GPU host), WHEELS=DIR installs from a directory of wheels that
# `make wheels PYVER=3.12` filled elsewhere, and SYSTEM_DEPS=0 skips the apt step (the
# samples are then built elsewhere and copied). `make lock` refreshes the lock file.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARCH ?= sm_90
WHEELS ?=
SYSTEM_DEPS ?= 1
PYVER ?= 3.12
ifneq ($(WHEELS),)
# pip reads these, here and in the tests that install into a venv of their own
export PIP_NO_INDEX := 1
export PIP_FIND_LINKS := $(abspath $(WHEELS))
endif

.PHONY: demo test lint samples install venv venv-broken system-deps wheels lock bench clean

# A tree copied with its .venv brings the stamp of a venv that may not run here: its python links
# by path to the interpreter that made it, which this machine may lack, or have in another
# version that does not read the venv's site-packages. Such a venv is made again from scratch,
# as is one of another version than a PYTHON given explicitly, which asks for that Python.
VENV_PYVER := $(shell $(PY) -c 'import os, sys, sysconfig; os.path.isdir(sysconfig.get_path("purelib")) and print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
ifneq ($(filter command line environment,$(origin PYTHON)),)
VENV_BROKEN := $(if $(filter $(VENV_PYVER),$(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)),,1)
else
VENV_BROKEN := $(if $(VENV_PYVER),,1)
endif

# A Python without ensurepip (some distributions ship it apart) makes the venv without pip,
# and its own pip installs into it (pip --python).
$(VENV)/.installed: pyproject.toml requirements.lock setup.py $(wildcard shim/*.c shim/*.h) $(if $(VENV_BROKEN),venv-broken)
	$(PYTHON) -m venv $(if $(VENV_BROKEN),--clear) $(VENV) || $(PYTHON) -m venv --without-pip $(if $(VENV_BROKEN),--clear) $(VENV)
	set -e; if [ -x $(VENV)/bin/pip ]; then pip="$(PY) -m pip"; else pip="$(PYTHON) -m pip --python $(PY)"; fi; \
	$$pip install -q --disable-pip-version-check --require-hashes -r requirements.lock; \
	$$pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

venv: $(VENV)/.installed

venv-broken:

system-deps:
	@if [ "$(SYSTEM_DEPS)" = 1 ]; then scripts/install-deps; fi

install: system-deps venv

samples: install
	$(PY) samples/build.py --arch $(ARCH)
	$(PY) samples/build_hip.py

demo: samples
	$(PY) -m scripts.demo --arch $(ARCH)

test: lint samples
	$(PY) -m pytest

# ruff (pyproject.toml's [tool.ruff]; pinned in requirements.lock) on every Python file, and
# clang-format-19 (.clang-format; scripts/install-deps installs it) on the C sources. A missing
# tool fails the target. shim/protocol.h is generated (runtime/protocol.py; its drift test
# guards it), and bench/launch_handles.c, built by hand, is left as written (clang-format cannot
# parse its lists of macro calls).
CLANG_FORMAT_FILES := $(filter-out shim/protocol.h shim/compare_ptx.h,$(wildcard shim/*.c shim/*.h tests/shim/*.c tests/support/*.c bench/lib/*.c bench/micro/*.c))
lint: install
	$(PY) -m ruff check .
	clang-format-19 --dry-run --Werror $(CLANG_FORMAT_FILES)

# Wheels of every locked package for another Python (default 3.12, x86-64 Linux), for a
# machine that reaches no index: copy .whl/ there and run `make test WHEELS=.whl SYSTEM_DEPS=0`,
# and PYTHON=python3.12 (the PYVER given here) where its python3 is another version.
wheels: venv
	$(PY) scripts/wheels --python-version $(PYVER) --dest .whl

# Re-resolve every dependency (runtime, test, build) to its newest allowed version.
lock:
	scripts/lock

# CPU benchmarks (bench/micro/); the GPU ones run through scripts/gpu-run.sh on a machine with a GPU
bench: samples
	$(PY) -m bench.micro.extract_bench
	$(PY) -m bench.micro.specialize_bench
	$(PY) -m bench.micro.cache_bench
	$(PY) -m bench.micro.hitpath_bench
	$(PY) -m bench.micro.exit_cost
	$(PY) -m bench.micro.miss_bench

clean:
	rm -rf samples/build proteus-out bench/work .pytest_cache
