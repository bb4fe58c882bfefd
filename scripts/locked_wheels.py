"""Which of requirements.lock's pins, and which wheel tags, another Python on x86-64 Linux needs:
shared by scripts/wheels, which downloads them, and tests/cpu/test_offline_wheels.py, which
resolves them against the index without downloading."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags

ARCH = "x86_64"
# Newest glibc a wheel may require. A wheel built for a newer one would download here and then
# fail to install on the offline machine; refusing it at download time says so where an index
# is still at hand.
GLIBC_MAX = 39
# PEP 600 names a wheel by the oldest glibc it runs on; the older PEP 513/571/599 names stand
# for glibc 2.5, 2.12 and 2.17.
LEGACY = {5: "manylinux1", 12: "manylinux2010", 17: "manylinux2014"}


def platforms(glibc_max: int = GLIBC_MAX, arch: str = ARCH) -> list[str]:
    """Every manylinux platform tag up to glibc 2.`glibc_max`, oldest first: pip takes the
    first platform that has a wheel, and the oldest glibc installs on the most machines."""
    out = []
    for minor in range(5, glibc_max + 1):
        if minor in LEGACY:
            out.append(f"{LEGACY[minor]}_{arch}")
        out.append(f"manylinux_2_{minor}_{arch}")
    return out


PLATFORMS = platforms()


def supported_tags(version: str, plats: list[str] | None = None) -> list[Tag]:
    """The tags pip accepts for CPython `version` (3.12) on `plats`, best first, as
    `pip download --python-version V --implementation cp --platform P...` computes them (the
    regular build: no debug or free-threaded ABI)."""
    plats = PLATFORMS if plats is None else plats
    major, minor = (int(x) for x in version.split("."))
    abi = f"cp{major}{minor}"
    return [*cpython_tags((major, minor), abis=[abi], platforms=plats),
            *compatible_tags((major, minor), interpreter=abi, platforms=plats)]


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: tuple[str, ...]  # sha256 hex digests

    def requirement(self) -> str:
        """The line pip reads, hashes kept, marker dropped."""
        return " ".join([f"{self.name}=={self.version}", *(f"--hash=sha256:{h}" for h in self.hashes)])


def pins(lock: str, version: str) -> list[Pin]:
    """The lock's pins that apply to CPython `version` on x86-64 Linux. pip would evaluate the
    markers (numpy is pinned per Python version) against the Python that runs it, not the
    target, so they are evaluated here."""
    env = {"python_version": version, "python_full_version": f"{version}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": ARCH, "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    out = []
    for line in lock.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, hashes = line.partition(" --hash")
        spec, _, marker = spec.partition(";")
        if marker.strip() and not Marker(marker.strip()).evaluate(env):
            continue
        name, sep, pinned = spec.strip().partition("==")
        if not sep:
            raise ValueError(f"requirements.lock: not pinned with ==: {spec.strip()}")
        digests = tuple(h.split(":", 1)[1] for h in f"--hash{hashes}".split() if h.startswith("--hash=sha256:"))
        out.append(Pin(name.strip(), pinned.strip(), digests))
    return out
