"""The kernel store: one file per app holding its kernel table and bitcode.

Format (version 1), little endian:

    offset size
         0    8  magic b"PRKSTORE"
         8    4  format version (1)
        12    4  flags (0)
        16    8  manifest length M
        24    8  blob area length B
        32   32  SHA-256 of bytes [64, 64 + M + B)
        64    M  manifest: UTF-8 JSON (the kernel table; each module names its blob by offset,
                 size and SHA-256)
    64 + M    B  blobs: the modules (bitcode, or PTX text), back to back

The store is data, never code: JSON, raw bitcode and PTX text, no pickle. It is written to a
temporary file in the destination directory and renamed into place, so readers see
either the old store or the new one. Readers verify the magic, version, lengths and
checksum before trusting anything in it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import tempfile
import time
from pathlib import Path

from . import __version__
from .errors import StoreError
from .fatbin.table import (
    AppInfo,
    EntryRecord,
    FatbinRecord,
    KernelRecord,
    KernelTable,
    ModuleRecord,
    ParamRecord,
)

MAGIC = b"PRKSTORE"
VERSION = 1
HEADER = struct.Struct("<8sIIQQ32s")
assert HEADER.size == 64
SUFFIX = ".kstore"


def store_path(outdir: str | os.PathLike, app_name: str) -> Path:
    return Path(outdir) / f"{app_name}{SUFFIX}"


def serialize(table: KernelTable) -> bytes:
    blobs = bytearray()
    modules = []
    for m in table.modules:
        modules.append(
            {
                "index": m.index,
                "sha256": m.sha256,
                "arch": m.arch,
                "fatbin": m.fatbin,
                "source_filename": m.source_filename,
                "triple": m.triple,
                "cmdline": list(m.cmdline),
                "ptx_target": m.ptx_target,
                "kind": m.kind,
                "offset": len(blobs),
                "size": len(m.code),
            }
        )
        blobs += m.code
    manifest = {
        "tool": f"proteus-rewrite {__version__}",
        "format": VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "app": dataclasses.asdict(table.app),
        "fatbins": [dataclasses.asdict(f) for f in table.fatbins],
        "modules": modules,
        "kernels": [dataclasses.asdict(k) for k in table.kernels],
        "warnings": list(table.warnings),
        "denied": table.denied,
    }
    body = json.dumps(manifest, separators=(",", ":")).encode() + bytes(blobs)
    manifest_len = len(body) - len(blobs)
    digest = hashlib.sha256(body).digest()
    return HEADER.pack(MAGIC, VERSION, 0, manifest_len, len(blobs), digest) + body


def write(table: KernelTable, path: str | os.PathLike) -> Path:
    """Write the store atomically (temporary file + fsync + rename)."""
    path = Path(path)
    data = serialize(table)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise StoreError(f"cannot write the kernel store: {exc.strerror or exc}", path) from None
    return path


def read(path: str | os.PathLike) -> KernelTable:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StoreError("no kernel store here (run `proteus-rewrite APP` first)", path) from None
    except OSError as exc:
        raise StoreError(f"cannot read the kernel store: {exc.strerror or exc}", path) from None
    return deserialize(data, path)


def deserialize(data: bytes, path: str | os.PathLike | None = None) -> KernelTable:
    if len(data) < HEADER.size:
        raise StoreError("not a kernel store (file too short)", path)
    magic, version, _flags, manifest_len, blob_len, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise StoreError("not a kernel store (bad magic)", path)
    if version != VERSION:
        raise StoreError(
            f"kernel store format {version} is not readable by this tool (format {VERSION}); "
            "re-run proteus-rewrite on the app",
            path,
        )
    if HEADER.size + manifest_len + blob_len != len(data):
        raise StoreError(
            f"kernel store is {len(data)} bytes but its header says {HEADER.size + manifest_len + blob_len} (truncated?)",
            path,
        )
    body = memoryview(data)[HEADER.size :]
    if hashlib.sha256(body).digest() != digest:
        raise StoreError("kernel store checksum mismatch (corrupt file)", path)
    try:
        manifest = json.loads(bytes(body[:manifest_len]))
        blobs = body[manifest_len:]
        modules = []
        for m in manifest["modules"]:
            blob = bytes(blobs[m["offset"] : m["offset"] + m["size"]])
            if len(blob) != m["size"] or hashlib.sha256(blob).hexdigest() != m["sha256"]:
                raise StoreError(f"module {m['index']} does not match its checksum", path)
            modules.append(
                ModuleRecord(
                    index=m["index"],
                    sha256=m["sha256"],
                    arch=m["arch"],
                    fatbin=m["fatbin"],
                    source_filename=m["source_filename"],
                    triple=m["triple"],
                    cmdline=tuple(m["cmdline"]),
                    code=blob,
                    ptx_target=m.get("ptx_target"),  # stores written before it was recorded have none
                    kind=m.get("kind", "bitcode"),
                )
            )
        return KernelTable(
            app=AppInfo(**manifest["app"]),
            fatbins=tuple(
                FatbinRecord(**{**f, "entries": tuple(EntryRecord(**e) for e in f["entries"])})
                for f in manifest["fatbins"]
            ),
            modules=tuple(modules),
            kernels=tuple(_kernel(k) for k in manifest["kernels"]),
            warnings=tuple(manifest["warnings"]),
            denied=dict(manifest.get("denied") or {}),  # stores written before validation have none
        )
    except StoreError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"kernel store manifest is malformed ({type(exc).__name__}: {exc})", path) from None


def _tuple_or_none(v):
    return tuple(v) if v is not None else None


def _kernel(k: dict) -> KernelRecord:
    return KernelRecord(
        **{
            **k,
            "link_modules": tuple(k["link_modules"]),
            "params": tuple(ParamRecord(**p) for p in k["params"]),
            "globals": tuple(k["globals"]),
            "max_threads": _tuple_or_none(k["max_threads"]),
            "jit_args": _tuple_or_none(k["jit_args"]),
        }
    )
