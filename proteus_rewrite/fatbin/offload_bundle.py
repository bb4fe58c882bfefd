"""Clang offload bundles, as found in a HIP host ELF's .hip_fatbin section.

A section holds one bundle per translation unit (each padded to a 4096-byte boundary by
the linker). A bundle, as clang-offload-bundler writes it (little endian):

    24  magic "__CLANG_OFFLOAD_BUNDLE__"
     8  number of entries
    then per entry: u64 offset (from the bundle start), u64 size, u64 id length, id
    then the entries' bytes

An id is `<kind>-<triple>-<target id>`, e.g. `hipv4-amdgcn-amd-amdhsa--gfx90a` (kind hipv4:
an AMDGPU code object; the empty fourth triple component is the environment) or
`host-x86_64-unknown-linux--` (the empty host entry). A target id may carry features:
`gfx90a:sramecc+:xnack-`.

Newer clang (`--offload-compress`, ROCm 6's default) stores the bundle compressed, in a
CCOB wrapper (LLVM's OffloadBundler.cpp):

    version 1:  "CCOB" u16 version, u16 method, u32 uncompressed size, u64 hash, data
    version 2:  "CCOB" u16 version, u16 method, u32 total size, u32 uncompressed size, u64 hash, data
    version 3:  "CCOB" u16 version, u16 method, u64 total size, u64 uncompressed size, u64 hash, data

method 0 = zlib, 1 = zstd; the hash is a truncated MD5 of the uncompressed bundle, which
the runtime uses as a cache key, not an integrity check, so it is kept but not verified.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass, field

import zstandard

from ..errors import FormatError
from .layouts import CCOB_MAGIC
from .layouts import OFFLOAD_BUNDLE_MAGIC as MAGIC

HEADER = struct.Struct("<24sQ")
ENTRY = struct.Struct("<QQQ")
CCOB_V1 = struct.Struct("<4sHHIQ")
CCOB_V2 = struct.Struct("<4sHHIIQ")
CCOB_V3 = struct.Struct("<4sHHQQQ")
COMPRESSION = {0: "zlib", 1: "zstd"}
# A corrupt size field must not make us allocate gigabytes; real bundles are megabytes.
MAX_UNCOMPRESSED = (1 << 31) - 1
MAX_ID = 4096
CODE_OBJECT_KINDS = ("hipv4", "hip", "hipnv")


@dataclass(frozen=True)
class BundleEntry:
    id: str
    offset: int  # from the start of the (uncompressed) bundle
    size: int
    data: bytes = field(repr=False)

    @property
    def kind(self) -> str:
        return self.id.split("-", 1)[0]

    @property
    def triple(self) -> str:
        return "-".join(self._split()[0]).rstrip("-")

    @property
    def target_id(self) -> str:
        """`gfx90a`, `gfx90a:xnack-`; empty for the host entry."""
        return self._split()[1]

    @property
    def arch(self) -> str:
        """The processor without features: `gfx90a`."""
        return self.target_id.split(":", 1)[0]

    @property
    def is_code_object(self) -> bool:
        return self.kind in CODE_OBJECT_KINDS and self.triple.startswith("amdgcn-") and self.size > 0

    def _split(self) -> tuple[list[str], str]:
        rest = self.id.split("-", 1)[1] if "-" in self.id else ""
        parts = rest.split("-", 4)
        # Clang before 12 wrote three-part triples: hip-amdgcn-amd-amdhsa-gfx906.
        if len(parts) == 4 and parts[3].startswith("gfx"):
            return parts[:3], parts[3]
        return parts[:4], (parts[4] if len(parts) > 4 else "")


@dataclass(frozen=True)
class Bundle:
    offset: int  # in the section
    stored_size: int  # bytes it occupies in the section (the CCOB wrapper, when compressed)
    size: int  # bytes of the uncompressed bundle
    compression: str  # none | zstd | zlib
    ccob_version: int | None
    digest: str  # sha256 of the stored bytes: what __hipRegisterFatBinary is handed
    entries: tuple[BundleEntry, ...]

    @property
    def end(self) -> int:
        return self.offset + self.stored_size

    @property
    def code_objects(self) -> list[BundleEntry]:
        return [e for e in self.entries if e.is_code_object]


def parse(data: bytes, offset: int = 0) -> Bundle:
    """The bundle (plain or CCOB-compressed) at ``offset`` of ``data`` (a section's bytes)."""
    head = data[offset : offset + 4]
    if head == CCOB_MAGIC:
        raw, stored, method, version = decompress(data, offset)
    elif data[offset : offset + len(MAGIC)] == MAGIC:
        raw, method, version = None, "none", None
        stored = 0
    else:
        raise FormatError(f"offload bundle at offset {offset:#x}: no __CLANG_OFFLOAD_BUNDLE__ or CCOB magic")
    body = raw if raw is not None else data[offset:]
    entries = _entries(body, offset)
    if raw is None:
        stored = max((e.offset + e.size for e in entries), default=HEADER.size)
        stored = max(stored, _table_end(body))
    return Bundle(
        offset=offset,
        stored_size=stored,
        size=len(raw) if raw is not None else stored,
        compression=method,
        ccob_version=version,
        digest=hashlib.sha256(data[offset : offset + stored]).hexdigest(),
        entries=entries,
    )


def parse_section(data: bytes) -> list[Bundle]:
    """All bundles of a .hip_fatbin section, skipping the zero padding between them."""
    bundles = []
    pos = 0
    while pos < len(data):
        rest = data[pos:].lstrip(b"\0")
        if not rest:
            break
        b = parse(data, len(data) - len(rest))
        bundles.append(b)
        pos = b.end
    if not bundles:
        raise FormatError("the .hip_fatbin section holds no offload bundle")
    return bundles


def stored_size(read) -> int:
    """How many bytes the bundle (plain or CCOB) at the start of `read` occupies, reading no
    further than needed: `read(offset, n)` returns n bytes from there. This is how the run time
    finds the extent of a bundle in memory (what __hipRegisterFatBinary is handed, which comes
    with no size) to hash it; parse() gives the same number as `stored_size` for bytes at hand."""
    head = read(0, HEADER.size)
    if head[:4] == CCOB_MAGIC:
        (version,) = struct.unpack_from("<H", head, 4)
        if version == 2:
            return CCOB_V2.unpack_from(head)[3]
        if version == 3:
            return CCOB_V3.unpack_from(head)[3]
        if version != 1:
            raise FormatError(f"compressed offload bundle: CCOB version {version} is not known (1, 2 and 3 are)")
        # Version 1 has no total size: inflate until the stream ends, a little at a time.
        _, _, method_id, usize, _ = CCOB_V1.unpack_from(head)
        method = COMPRESSION.get(method_id)
        if method is None:
            raise FormatError(f"compressed offload bundle: compression method {method_id} is not known (0 zlib, 1 zstd)")
        d = zstandard.ZstdDecompressor().decompressobj() if method == "zstd" else zlib.decompressobj()
        pos, out = CCOB_V1.size, 0
        while not d.eof:
            out += len(d.decompress(read(pos, 256)))
            pos += 256
            if out > usize:
                raise FormatError(f"compressed offload bundle: inflates past the {usize} bytes its header declares")
        return pos - len(d.unused_data)
    if head[: len(MAGIC)] != MAGIC:
        raise FormatError("no __CLANG_OFFLOAD_BUNDLE__ or CCOB magic")
    (count,) = struct.unpack_from("<Q", head, len(MAGIC))
    if count > MAX_ID:
        raise FormatError(f"offload bundle declares {count} entries")
    pos = end = HEADER.size
    for i in range(count):
        eoff, esize, idlen = ENTRY.unpack(read(pos, ENTRY.size))
        if idlen > MAX_ID or eoff + esize > MAX_UNCOMPRESSED:
            raise FormatError(f"offload bundle entry {i} is corrupt")
        pos += ENTRY.size + idlen
        end = max(end, eoff + esize)
    return max(end, pos)


def decompress(data: bytes, offset: int = 0) -> tuple[bytes, int, str, int]:
    """A CCOB wrapper at ``offset`` -> (uncompressed bundle, stored size, method, version)."""
    where = f"compressed offload bundle at offset {offset:#x}"
    if offset + 8 > len(data):
        raise FormatError(f"{where}: header truncated")
    (version,) = struct.unpack_from("<H", data, offset + 4)
    if version == 1:
        hdr = CCOB_V1
    elif version == 2:
        hdr = CCOB_V2
    elif version == 3:
        hdr = CCOB_V3
    else:
        raise FormatError(f"{where}: CCOB version {version} is not known (1, 2 and 3 are)")
    if offset + hdr.size > len(data):
        raise FormatError(f"{where}: header truncated")
    fields = hdr.unpack_from(data, offset)
    method_id = fields[2]
    if version == 1:
        total, usize = None, fields[3]
    else:
        total, usize = fields[3], fields[4]
    method = COMPRESSION.get(method_id)
    if method is None:
        raise FormatError(f"{where}: compression method {method_id} is not known (0 zlib, 1 zstd)")
    if usize > MAX_UNCOMPRESSED:
        raise FormatError(f"{where}: declares {usize} uncompressed bytes (over the {MAX_UNCOMPRESSED} limit)")
    if total is not None and (total < hdr.size or offset + total > len(data)):
        raise FormatError(f"{where}: declares {total} bytes, {len(data) - offset} present (truncated?)")
    start = offset + hdr.size
    end = offset + total if total is not None else len(data)
    payload = data[start:end]
    # Version 1 has no total size: the stream's own end tells where the next bundle starts.
    try:
        raw, unused = _inflate(payload, method, usize, where)
    except zstandard.ZstdError as exc:
        raise FormatError(f"{where}: zstd data is corrupt ({str(exc).splitlines()[0] if str(exc) else 'ZstdError'})") from None
    except zlib.error as exc:
        raise FormatError(f"{where}: zlib data is corrupt ({exc})") from None
    if len(raw) != usize:
        raise FormatError(f"{where}: inflates to {len(raw)} bytes, header says {usize}")
    stored = total if total is not None else hdr.size + len(payload) - unused
    return raw, stored, method, version


def _inflate(payload: bytes, method: str, usize: int, where: str) -> tuple[bytes, int]:
    """(the inflated stream, how many input bytes follow its end). Fed in chunks, so that a
    stream inflating past its declared size is stopped near that size, not at memory's end."""
    d = zstandard.ZstdDecompressor().decompressobj() if method == "zstd" else zlib.decompressobj()
    out = bytearray()
    chunk = 1 << 16
    for pos in range(0, len(payload), chunk):
        out += d.decompress(payload[pos : pos + chunk])
        if len(out) > usize:
            raise FormatError(f"{where}: inflates past the {usize} bytes its header declares")
        if d.eof:
            break
    if not d.eof:
        raise FormatError(f"{where}: {method} stream truncated")
    return bytes(out), len(d.unused_data)


def _entries(body: bytes, offset: int) -> tuple[BundleEntry, ...]:
    where = f"offload bundle at offset {offset:#x}"
    if len(body) < HEADER.size or body[: len(MAGIC)] != MAGIC:
        raise FormatError(f"{where}: no __CLANG_OFFLOAD_BUNDLE__ magic (corrupt or not a bundle)")
    _, count = HEADER.unpack_from(body)
    # Each entry needs at least its 24-byte record: a count beyond that is corrupt.
    if count > (len(body) - HEADER.size) // ENTRY.size:
        raise FormatError(f"{where}: declares {count} entries, which do not fit in {len(body)} bytes")
    pos = HEADER.size
    entries = []
    for i in range(count):
        if pos + ENTRY.size > len(body):
            raise FormatError(f"{where}: entry table truncated at entry {i}")
        eoff, esize, idlen = ENTRY.unpack_from(body, pos)
        pos += ENTRY.size
        if idlen > MAX_ID or pos + idlen > len(body):
            raise FormatError(f"{where}: entry {i} has an id of {idlen} bytes (corrupt or truncated)")
        try:
            ident = body[pos : pos + idlen].decode("ascii")
        except UnicodeDecodeError:
            raise FormatError(f"{where}: entry {i} has a non-ASCII id") from None
        pos += idlen
        if eoff + esize > len(body):
            raise FormatError(
                f"{where}: entry {i} ({ident}) spans bytes {eoff}..{eoff + esize}, the bundle has {len(body)} (truncated?)"
            )
        entries.append(BundleEntry(ident, eoff, esize, bytes(body[eoff : eoff + esize])))
    return tuple(entries)


def _table_end(body: bytes) -> int:
    """Where the entry table ends (a bundle of empty entries is no longer than its table)."""
    _, count = HEADER.unpack_from(body)
    pos = HEADER.size
    for _ in range(count):
        _, _, idlen = ENTRY.unpack_from(body, pos)
        pos += ENTRY.size + idlen
    return pos
