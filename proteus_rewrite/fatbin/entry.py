"""One entry of a CUDA fat binary container: its header and its (decompressed) payload.

Entry header, little endian (64 bytes for cubins, larger for PTX, whose header carries
the ptxas options), as written by CUDA's `fatbinary` and read by the CUDA runtime:

    off size field
      0   2  kind               1 = PTX, 2 = ELF (cubin), 4 = LTO IR
      2   2  entry format version (0x0101)
      4   4  header size        (offset of the payload from the entry start)
      8   8  payload size       (bytes stored, including padding)
     16   4  compressed size    (0 when stored uncompressed)
     20   4  options offset     (from the entry start; PTX only, 0 = none)
     24   2  version minor      (PTX ISA version for PTX entries)
     26   2  version major
     28   4  arch               (SM version, e.g. 90)
     32   4  name offset, 36: 4 name size  (an object name, rarely used)
     40   8  flags              (0x1 64-bit, 0x2 debug, 0x10 Linux host,
                                 0x2000 LZ4-compressed, 0x8000 zstd-compressed)
     48   8  reserved
     56   8  uncompressed size  (0 when stored uncompressed)
At the options offset: u32 offset of the options string (from the entry start), u32 its length.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

import lz4.block
import zstandard

from ..errors import FormatError
from .layouts import ZSTD_MAGIC

HEADER = struct.Struct("<HHIQIIHHIIIQQQ")
assert HEADER.size == 64

FLAG_64BIT = 0x1
FLAG_DEBUG = 0x2
FLAG_LINUX = 0x10
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000

# Refuse to inflate an entry beyond this: a corrupt header must not exhaust memory.
MAX_UNCOMPRESSED = (1 << 31) - 1  # also the LZ4 library's limit (a C int)


class Kind(IntEnum):
    PTX = 1
    ELF = 2
    LTOIR = 4


@dataclass(frozen=True)
class Entry:
    offset: int  # entry start, relative to the section the container lives in
    kind: int
    format_version: int
    header_size: int
    payload_size: int
    compressed_size: int
    version: tuple[int, int]
    arch: int
    flags: int
    uncompressed_size: int
    options: str
    stored: bytes = field(repr=False)  # the payload exactly as stored (possibly compressed, padded)

    @property
    def kind_name(self) -> str:
        try:
            return Kind(self.kind).name
        except ValueError:
            return f"kind{self.kind}"

    @property
    def compression(self) -> str:
        if self.flags & FLAG_ZSTD:
            return "zstd"
        if self.flags & FLAG_LZ4:
            return "lz4"
        return "none"

    @property
    def size(self) -> int:
        return self.header_size + self.payload_size

    def payload(self) -> bytes:
        """The entry's content, decompressed; PTX without its trailing NUL padding."""
        where = f"fatbin entry at offset {self.offset:#x} ({self.kind_name} sm_{self.arch})"
        method = self.compression
        if method == "none":
            data = self.stored
        else:
            data = _decompress(method, self.stored, self.compressed_size, self.uncompressed_size, where)
        if self.kind == Kind.PTX:
            data = data.rstrip(b"\0")
        return data


def parse(data: bytes, offset: int, limit: int | None = None) -> Entry:
    """Parse the entry that starts at ``offset`` of ``data``; it must end by ``limit``."""
    limit = len(data) if limit is None else limit
    if offset + HEADER.size > limit:
        raise FormatError(f"fatbin entry at offset {offset:#x}: header truncated")
    (kind, fmt_version, header_size, payload_size, compressed_size, options_offset, minor, major, arch,
     _name_off, _name_size, flags, _reserved, uncompressed_size) = HEADER.unpack_from(data, offset)
    if header_size < HEADER.size:
        raise FormatError(f"fatbin entry at offset {offset:#x}: header size {header_size} is below {HEADER.size}")
    end = offset + header_size + payload_size
    if end > limit:
        raise FormatError(
            f"fatbin entry at offset {offset:#x}: payload of {payload_size} bytes runs past the container "
            f"({limit - offset - header_size} bytes left; truncated?)"
        )
    options = ""
    if options_offset:
        if options_offset + 8 > header_size:
            raise FormatError(f"fatbin entry at offset {offset:#x}: options record outside the header")
        str_off, str_len = struct.unpack_from("<II", data, offset + options_offset)
        if str_off + str_len > header_size:
            raise FormatError(f"fatbin entry at offset {offset:#x}: options string outside the header")
        options = data[offset + str_off : offset + str_off + str_len].split(b"\0", 1)[0].decode("utf-8", "replace")
    if flags & (FLAG_LZ4 | FLAG_ZSTD) and compressed_size > payload_size:
        raise FormatError(
            f"fatbin entry at offset {offset:#x}: compressed size {compressed_size} exceeds payload size {payload_size}"
        )
    return Entry(
        offset=offset,
        kind=kind,
        format_version=fmt_version,
        header_size=header_size,
        payload_size=payload_size,
        compressed_size=compressed_size,
        version=(major, minor),
        arch=arch,
        flags=flags,
        uncompressed_size=uncompressed_size,
        options=options,
        stored=data[offset + header_size : end],
    )


def _decompress(method: str, stored: bytes, compressed_size: int, uncompressed_size: int, where: str) -> bytes:
    if not 0 < uncompressed_size <= MAX_UNCOMPRESSED:
        raise FormatError(f"{where}: implausible uncompressed size {uncompressed_size}")
    blob = stored[:compressed_size] if compressed_size else stored
    try:
        if method == "zstd":
            if blob[:4] != ZSTD_MAGIC:
                raise FormatError(f"{where}: flagged zstd but the payload has no zstd frame magic")
            declared = zstandard.frame_content_size(blob)
            if declared > uncompressed_size:
                raise FormatError(f"{where}: zstd frame declares {declared} bytes, header says {uncompressed_size}")
            out = zstandard.ZstdDecompressor().decompress(blob, max_output_size=uncompressed_size)
        else:
            out = lz4.block.decompress(blob, uncompressed_size=uncompressed_size)
    except FormatError:
        raise
    except (zstandard.ZstdError, lz4.block.LZ4BlockError, ValueError, OverflowError, MemoryError) as exc:
        raise FormatError(f"{where}: corrupt {method} payload ({exc})") from None
    if len(out) != uncompressed_size:
        raise FormatError(f"{where}: {method} payload inflated to {len(out)} bytes, header says {uncompressed_size}")
    return out
