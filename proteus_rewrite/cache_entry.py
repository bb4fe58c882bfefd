"""A cache entry and its bytes, the same in every tier (a file of the node-local directory or of
the shared one, a Redis value):

    magic b"PRJITC01" | u32 meta length | u32 flags | u64 payload length | 32-byte SHA-256 of
    meta + payload | meta (UTF-8 JSON) | payload (cubin or PTX) [| 32-byte HMAC-SHA256]

The checksum lets a tier tell a damaged entry from a whole one, so that it is rebuilt, never
loaded. Entries may carry an HMAC-SHA256 over meta + payload (`encode(entry, secret)`, the flags
word's FLAG_HMAC): a tier given a secret refuses entries without a valid one (a miss, counted in
stats.refused).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = b"PRJITC01"
HEADER = struct.Struct("<8sIIQ32s")
SUFFIX = ".pjc"
TOMBSTONE = "tombstone"  # an Entry kind: the variant failed (meta "reason"); nobody retries it
FLAG_HMAC = 1  # header's flags word: a 32-byte HMAC-SHA256 of meta + payload follows the payload


@dataclass(frozen=True)
class Entry:
    key: str
    kind: str  # "cubin", "ptx" or "codeobj" (an AMDGPU code object)
    arch: int | str  # SM version (90) or AMDGPU processor ("gfx90a")
    data: bytes = field(repr=False)
    meta: dict = field(default_factory=dict, compare=False)



def tombstone_entry(key: str, arch, reason: str) -> Entry:
    return Entry(key, TOMBSTONE, arch, b"", {"reason": reason[:500], "host": socket.gethostname(), "pid": os.getpid(),
                                             "time": time.time()})


def encode(entry: Entry, secret: bytes | None = None) -> bytes:
    """The entry's bytes; with a secret, an HMAC-SHA256 of meta + payload follows the payload
    (the header's flags say so)."""
    meta = dict(entry.meta, key=entry.key, kind=entry.kind, arch=entry.arch)
    meta_raw = json.dumps(meta, sort_keys=True).encode()
    digest = hashlib.sha256(meta_raw + entry.data).digest()
    flags = FLAG_HMAC if secret else 0
    out = HEADER.pack(MAGIC, len(meta_raw), flags, len(entry.data), digest) + meta_raw + entry.data
    if secret:
        out += hmac.new(secret, meta_raw + entry.data, hashlib.sha256).digest()
    return out


def decode(raw: bytes, key: str | None = None, secret: bytes | None = None) -> Entry | None:
    """The entry, or None if the bytes are not a whole, intact entry (for that key), or, with a
    secret, not signed with it."""
    return decode_checked(raw, key, secret)[0]


def decode_checked(raw: bytes, key: str | None = None, secret: bytes | None = None) -> tuple[Entry | None, str]:
    """decode, and why not: "" (decoded), "damaged", or "unsigned" (whole, but without a valid
    HMAC where a secret is configured)."""
    if len(raw) < HEADER.size:
        return None, "damaged"
    magic, meta_len, flags, payload_len, digest = HEADER.unpack_from(raw)
    mac_len = 32 if flags & FLAG_HMAC else 0
    if magic != MAGIC or flags & ~FLAG_HMAC or HEADER.size + meta_len + payload_len + mac_len != len(raw):
        return None, "damaged"
    body = raw[HEADER.size : len(raw) - mac_len]
    if hashlib.sha256(body).digest() != digest:
        return None, "damaged"
    try:
        meta = json.loads(body[:meta_len])
        arch = meta["arch"] if isinstance(meta["arch"], str) else int(meta["arch"])
        entry = Entry(meta["key"], meta["kind"], arch, bytes(body[meta_len:]), meta)
    except (ValueError, KeyError, TypeError):
        return None, "damaged"
    if key is not None and entry.key != key:
        return None, "damaged"
    if secret:
        mac = raw[len(raw) - mac_len:] if mac_len else b""
        if not mac_len or not hmac.compare_digest(mac, hmac.new(secret, body, hashlib.sha256).digest()):
            return None, "unsigned"
    return entry, ""


def describe(path: Path) -> dict:
    """For `proteus-rewrite cache ls`: an entry's metadata, or why it is unreadable."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return {"file": path.name, "error": exc.strerror or str(exc)}
    entry = decode(raw)
    if entry is None:
        return {"file": path.name, "error": "damaged"}
    st = path.stat()
    return {
        "key": entry.key,
        "kernel": entry.meta.get("kernel", "?"),
        "kind": entry.kind,
        "arch": entry.arch,
        "bytes": len(raw),
        "compile_ms": entry.meta.get("compile_ms"),
        "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime)),
    }
