"""Building synthetic inputs for tests and benchmarks (the fuzz targets' seeds, the format tests)."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

from proteus_rewrite.fatbin import container


def container_bytes(entries: list[bytes]) -> bytes:
    """A fat binary container holding the given raw entries (header + stored payload each)."""
    body = b"".join(entries)
    return struct.pack("<IHHQ", container.MAGIC, 1, 16, len(body)) + body


def raw_entry(section: bytes, e) -> bytes:
    """The bytes of entry ``e`` (header and stored payload) as they appear in ``section``."""
    return section[e.offset : e.offset + e.size]


def host_elf_with_fatbin(tmp: Path, fatbin: bytes, name: str = "app") -> Path:
    """A real x86-64 executable whose .nv_fatbin section holds ``fatbin`` (gcc + .incbin)."""
    blob = tmp / f"{name}.fatbin"
    blob.write_bytes(fatbin)
    asm = tmp / f"{name}.s"
    asm.write_text(
        f'.section .nv_fatbin,"a"\n.balign 8\n.incbin "{blob}"\n'
        '.text\n.globl main\nmain:\n xor %eax, %eax\n ret\n.section .note.GNU-stack,"",@progbits\n'
    )
    exe = tmp / name
    subprocess.run(["gcc", str(asm), "-o", str(exe)], check=True, capture_output=True)
    return exe
