"""Rewritten executables: a copy of the app that loads libproteus.so by itself.

Three changes, made with LIEF, and nothing else:
  - `libproteus.so` becomes the first DT_NEEDED entry, so the shim precedes libc and the
    CUDA runtime in symbol lookup (its `dlsym` must win for static-cudart apps);
  - `$ORIGIN` is put first in the existing DT_RUNPATH (or DT_RPATH, if that is what the app
    uses: adding a RUNPATH would silently disable an RPATH), or a DT_RUNPATH `$ORIGIN` is
    added, so the shim is found beside the executable wherever the directory is copied;
  - a non-loaded section `.proteus_rewrite` records the tool version and the original's
    SHA-256 (`proteus-rewrite inspect` shows it; rewriting it again needs --force).
The kernel store and the shim live beside the new executable; the fat binaries are left
byte for byte as they were, so the shim recognizes them.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path

import lief

from .. import __version__
from ..errors import InjectError
from ..fatbin import hostelf
from .shim import SHIM_NAME

MARKER = hostelf.MARKER_SECTION


def marker(elf: hostelf.HostElf) -> dict | None:
    """The rewrite record of a parsed host ELF, or None if it was not rewritten by us."""
    from ..fatbin.common import rewrite_record

    return rewrite_record(elf)


def rewrite(app: str | os.PathLike, data: bytes, outdir: str | os.PathLike, original_sha256: str, force: bool = False) -> Path:
    """Write DIR/<app name>: the app, loading libproteus.so from its own directory."""
    src = Path(app)
    dst = Path(outdir) / src.name
    if dst.resolve() == src.resolve():
        raise InjectError("the rewritten executable would replace the input; choose another output directory (-o)", src)
    elf = hostelf.parse(data)
    previous = marker(elf)
    if previous and not force:
        raise InjectError(f"already rewritten by {previous.get('tool', 'proteus-rewrite')}; pass --force to rewrite it again", src)
    if not elf.is_executable:
        raise InjectError("not an executable (a shared library or object file); only executables are rewritten", src)

    binary = lief.ELF.parse(io.BytesIO(data))
    if binary is None:
        raise InjectError("LIEF cannot read this ELF file", src)
    if not binary.has_library(SHIM_NAME):
        binary.add_library(SHIM_NAME)  # LIEF puts it first among the DT_NEEDED entries
    needed = [e.name for e in binary.dynamic_entries if isinstance(e, lief.ELF.DynamicEntryLibrary)]
    if needed[0] != SHIM_NAME:
        raise InjectError(f"could not make {SHIM_NAME} the first needed library (got {needed[0]})", src)
    _origin_first(binary, str(src.resolve().parent))

    if previous and previous.get("original_sha256"):
        original_sha256 = previous["original_sha256"]  # rewriting a rewritten app: keep naming the true original
    record = {"tool": f"proteus-rewrite {__version__}", "original_sha256": original_sha256, "original_name": src.name,
              "rewritten": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if binary.has_section(MARKER):
        binary.remove(binary.get_section(MARKER), clear=True)
    section = lief.ELF.Section(MARKER)
    section.content = list(json.dumps(record).encode())
    binary.add(section, loaded=False)

    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    os.close(fd)
    try:
        binary.write(tmp)
        mode = src.stat().st_mode & 0o777 if src.exists() else 0o755
        os.chmod(tmp, mode | 0o100)
        check = hostelf.parse(Path(tmp).read_bytes())
        if marker(check) is None or check.needed[:1] != (SHIM_NAME,):
            raise InjectError("the rewritten file does not read back as intended", dst)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dst


def _origin_first(binary, original_dir: str) -> None:
    for tag_cls in (lief.ELF.DynamicEntryRunPath, lief.ELF.DynamicEntryRpath):
        entries = [e for e in binary.dynamic_entries if isinstance(e, tag_cls)]
        if entries:
            entry = entries[0]
            original = [p for p in entry.paths if p]
            paths = [p for p in original if p != "$ORIGIN"]
            # The copy lives elsewhere: `$ORIGIN/../lib` would name a directory beside the copy, where
            # the app's own libraries (often the ones with its kernels) are not. Their place beside the
            # original comes first; the relative entries stay for a copy installed in the same layout.
            anchored = [_at_origin(p, original_dir) for p in original if "ORIGIN" in p]
            entry.paths = list(dict.fromkeys(["$ORIGIN", *anchored, *paths]))
            return
    binary.add(lief.ELF.DynamicEntryRunPath("$ORIGIN"))


def _at_origin(path: str, origin: str) -> str:
    return os.path.normpath(path.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))
