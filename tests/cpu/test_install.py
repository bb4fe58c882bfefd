"""The install a user makes, outside the source tree: a new virtual environment, the locked
dependencies, `pip install` of this checkout (not editable, not on PYTHONPATH), then the
console script on a sample and a cubin compiled through the compiler process with no CUDA
toolkit on the loader path: nvJitLink must come from the venv's wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv with this checkout installed as a user installs it (PIP_NO_INDEX/PIP_FIND_LINKS,
    which `make WHEELS=...` sets, are honoured: the GPU host reaches no index)."""
    home = tmp_path_factory.mktemp("user")
    env_dir = home / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = [env_dir / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, "--require-hashes", "-r", ROOT / "requirements.lock"], cwd=home)
    # a copy of the checkout's files, so that nothing is built inside the source tree
    src = home / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "samples", "bench", "tests",
                                                             "_shim", "*.egg-info", "__pycache__", ".whl", ".gpu"))
    _run([*pip, "--no-deps", "--no-build-isolation", src], cwd=home)
    return env_dir


def test_the_installed_package_records_a_sample_and_compiles_a_cubin_in_its_compiler_process(installed, samples,
                                                                                               tmp_path):
    empty = tmp_path / "no-toolkit"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROTEUS_", "PYTHON", "LD_", "CUDA_"))}
    env.update(PROTEUS_COMPILE_PROCESS="1", CUDA_PATH=str(empty), CUDA_HOME=str(empty),
               PROTEUS_CACHE_DIR=str(tmp_path / "cache"),
               # no toolkit at all: no ptxas either, which the default would take before nvJitLink
               PATH=os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "ptxas").exists()))
    tool = installed / "bin" / "proteus-rewrite"
    out = tmp_path / "out"
    _run([tool, samples / "loop_count", "-o", out], cwd=tmp_path, env=env)
    assert (out / "loop_count.kstore").is_file() and (out / "libproteus.so").is_file()
    cubin = tmp_path / "axpy.cubin"
    proc = _run([tool, "specialize", out / "loop_count.kstore", "axpy_loop", "--arg", "1=8", "--emit", "cubin",
                 "-o", cubin], cwd=tmp_path, env=env)
    data = cubin.read_bytes()
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 190  # EM_CUDA
    line = next(x for x in proc.stderr.splitlines() if x.startswith("compiler process, "))
    lib = Path(line.split(", ", 1)[1])
    assert lib.name.startswith("libnvJitLink.so") and lib.is_relative_to(installed.resolve()), proc.stderr
    # and the package it ran is the installed one, not the checkout
    where = _run([installed / "bin" / "python", "-c", "import proteus_rewrite; print(proteus_rewrite.__file__)"],
                 cwd=tmp_path, env=env).stdout.strip()
    assert Path(where).is_relative_to(installed) and sys.prefix != str(installed)
