"""The offline install of the README: `make wheels PYVER=3.12` must find, for every pin of
requirements.lock that applies to that Python, a wheel that Python accepts on x86-64 Linux and
whose hash the lock names. Checked for each supported Python against the index's file lists,
without downloading a wheel, with the pins and platform tags scripts/wheels uses. And a .venv
copied from another machine is made again rather than trusted for its stamp."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from scripts import locked_wheels as lw

ROOT = Path(__file__).resolve().parents[2]

INDEX = "https://pypi.org/simple"
LOCK = (ROOT / "requirements.lock").read_text()
REQUIRES_PYTHON = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
VERSIONS = [v for v in ("3.11", "3.12", "3.13", "3.14") if REQUIRES_PYTHON.contains(v)]
# The hand-written list scripts/wheels had: it lacked manylinux_2_25, the only Linux tag of the
# nvidia-cuda-cupti wheel the lock pins, so the download stopped there.
OLD_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                 "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def _files(name: str) -> list[dict]:
    """The index's files of project `name` (PEP 691: filename, hashes, requires-python)."""
    req = urllib.request.Request(f"{INDEX}/{canonicalize_name(name)}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json", "Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        body = resp.read()
        if resp.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return json.loads(body)["files"]


@pytest.fixture(scope="module")
def index() -> dict[str, list[dict]]:
    """Every locked project's file list, fetched once. An index that cannot be reached skips;
    one that answers with an error fails."""
    names = sorted({p.name for v in VERSIONS for p in lw.pins(LOCK, v)})

    def fetch(name):
        try:
            return _files(name)
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError):
            return _files(name)  # once more: one dropped connection is not an unreachable index

    try:
        with ThreadPoolExecutor(8) as pool:
            return dict(zip(names, pool.map(fetch, names)))
    except urllib.error.HTTPError as e:
        pytest.fail(f"{e.url}: HTTP {e.code} {e.reason}")
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"{INDEX} cannot be reached, so the locked wheels were not checked: {e}")


def wheel_for(pin, files: list[dict], version: str, platforms: list[str]) -> str | None:
    """The first of `files` that `pip download --python-version VERSION --platform P...` could
    take for `pin`: a wheel of the pinned version, with a tag that Python accepts on one of
    `platforms` and a sha256 the lock names, that does not exclude that Python."""
    accepted = set(lw.supported_tags(version, platforms))
    for f in files:
        try:
            _, wheel_version, _, tags = parse_wheel_filename(f["filename"])
        except (InvalidWheelFilename, InvalidVersion):
            continue  # an sdist, or a file too old to name its wheel as the standard does
        if wheel_version != Version(pin.version) or not tags & accepted:
            continue
        if f.get("hashes", {}).get("sha256") not in pin.hashes:
            continue
        try:
            if f.get("requires-python") and not SpecifierSet(f["requires-python"]).contains(version):
                continue
        except InvalidSpecifier:
            pass  # pip ignores a Requires-Python it cannot read
        return f["filename"]
    return None


def test_the_supported_pythons_are_checked():
    assert {"3.11", "3.12", "3.13"} <= set(VERSIONS), f"requires-python {REQUIRES_PYTHON} leaves {VERSIONS}"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_locked_pin_has_a_wheel_with_a_locked_hash_for(version, index):
    pins = lw.pins(LOCK, version)
    assert pins, f"requirements.lock pins nothing for Python {version}"
    missing = []
    for pin in pins:
        if wheel_for(pin, index[pin.name], version, lw.PLATFORMS) is None:
            same = sorted(f["filename"] for f in index[pin.name] if f"-{pin.version}-" in f["filename"]
                          or f"-{pin.version}." in f["filename"])
            missing.append(f"{pin.name}=={pin.version}: none of {same}")
    assert not missing, f"no wheel for Python {version} on x86-64 Linux:\n" + "\n".join(missing)


def test_a_wheel_whose_only_tag_the_platform_list_lacks_is_missed(index):
    """What made `make wheels PYVER=3.12` stop: the check above fails on the old list."""
    (cupti,) = [p for p in lw.pins(LOCK, "3.12") if p.name == "nvidia-cuda-cupti"]
    assert wheel_for(cupti, index[cupti.name], "3.12", OLD_PLATFORMS) is None
    found = wheel_for(cupti, index[cupti.name], "3.12", lw.PLATFORMS)
    assert found is not None and found.endswith("-py3-none-manylinux_2_25_x86_64.whl"), found


def test_the_platform_list_names_every_glibc_up_to_the_newest_oldest_first():
    minors = [int(p.split("_")[2]) for p in lw.PLATFORMS if p.startswith("manylinux_2_")]
    assert minors == list(range(5, lw.GLIBC_MAX + 1))
    assert {"manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"} <= set(lw.PLATFORMS)
    assert all(p.startswith("manylinux") and p.endswith("_x86_64") for p in lw.PLATFORMS)


# --- a .venv that came with the tree ---------------------------------------------------------

def _plan_venv(venv_dir: Path, *args: str) -> str:
    """What `make venv` would run for `venv_dir` (make -n), with nothing from a calling make."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON", "VENV")}
    proc = subprocess.run(["make", "-n", "-C", str(ROOT), "venv", f"VENV={venv_dir}", *args],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _made_venv(tmp_path: Path) -> Path:
    """A working venv with a fresh stamp, as `make venv` leaves it."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    (env_dir / ".installed").touch()
    return env_dir


def test_a_working_venv_is_left_as_it_is(tmp_path):
    env_dir = _made_venv(tmp_path)
    assert "-m venv" not in _plan_venv(env_dir)
    assert "-m venv" not in _plan_venv(env_dir, f"PYTHON={sys.executable}")


def test_a_venv_whose_interpreter_is_missing_is_made_again(tmp_path):
    env_dir = _made_venv(tmp_path)
    for link in (env_dir / "bin").glob("python*"):
        link.unlink()
        link.symlink_to(tmp_path / "gone" / "python3")
    assert f"-m venv --clear {env_dir}" in _plan_venv(env_dir)


def test_a_venv_whose_interpreter_is_of_another_version_than_its_packages_is_made_again(tmp_path):
    env_dir = _made_venv(tmp_path)
    (site,) = (env_dir / "lib").glob("python3.*")
    site.rename(site.with_name("python3.0"))
    assert f"-m venv --clear {env_dir}" in _plan_venv(env_dir)


def test_a_venv_of_another_version_than_the_python_given_is_made_again(tmp_path):
    env_dir = _made_venv(tmp_path)
    other = tmp_path / "python-other"
    other.write_text("#!/bin/sh\necho 3.0\n")
    other.chmod(0o755)
    assert f"-m venv --clear {env_dir}" in _plan_venv(env_dir, f"PYTHON={other}")
