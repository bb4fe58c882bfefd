"""CUDA fat binary containers, as found in a host ELF's .nv_fatbin section.

A section holds one container per registered fat binary (one per translation unit,
or one for a device-linked -fgpu-rdc program), each 8-byte aligned:

    u32 magic 0xBA55ED50, u16 version (1), u16 header size (16), u64 size of the entries

followed by its entries (see entry.py) back to back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..errors import FormatError
from . import entry as entry_mod
from .entry import Entry
from .layouts import FATBIN_HEADER as HEADER
from .layouts import FATBIN_MAGIC as MAGIC


@dataclass(frozen=True)
class Container:
    offset: int  # relative to the start of the section
    version: int
    header_size: int
    size: int  # bytes of entries
    digest: str  # sha256 of the whole container (header + entries): how the run time recognizes it
    entries: tuple[Entry, ...]

    @property
    def end(self) -> int:
        return self.offset + self.header_size + self.size


def parse(data: bytes, offset: int = 0) -> Container:
    """Parse the container at ``offset`` of ``data`` (a section's bytes)."""
    if offset + HEADER.size > len(data):
        raise FormatError(f"fatbin container at offset {offset:#x}: header truncated")
    magic, version, header_size, size = HEADER.unpack_from(data, offset)
    if magic != MAGIC:
        raise FormatError(f"fatbin container at offset {offset:#x}: bad magic {magic:#010x} (expected {MAGIC:#010x})")
    if header_size < HEADER.size:
        raise FormatError(f"fatbin container at offset {offset:#x}: header size {header_size} is below {HEADER.size}")
    end = offset + header_size + size
    if end > len(data):
        raise FormatError(
            f"fatbin container at offset {offset:#x}: declares {size} bytes of entries, "
            f"only {len(data) - offset - header_size} present (truncated?)"
        )
    entries = []
    pos = offset + header_size
    while pos < end:
        e = entry_mod.parse(data, pos, limit=end)  # entries may not reach past their container
        entries.append(e)
        pos += e.size
    return Container(
        offset=offset,
        version=version,
        header_size=header_size,
        size=size,
        digest=hashlib.sha256(data[offset:end]).hexdigest(),
        entries=tuple(entries),
    )


def parse_section(data: bytes) -> list[Container]:
    """All containers of a .nv_fatbin (or __nv_relfatbin) section, skipping alignment padding."""
    containers = []
    pos = 0
    while pos + HEADER.size <= len(data):
        if data[pos : pos + 8] == bytes(8):  # padding between containers
            pos += 8
            continue
        c = parse(data, pos)
        containers.append(c)
        pos = (c.end + 7) & ~7
    if not containers:
        raise FormatError("fatbin section holds no fatbin container")
    return containers
