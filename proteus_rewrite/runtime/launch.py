"""A launch as the shim hands it over, decoded once: its argument bytes split per parameter, its
grid and block, and the addresses of its kernel's device variables. The value tracker
(miss.py) and the miss flow (flow.py) both read launches through decode_launch, so that a
launch's bytes are split in one place, once per launch."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from ..fatbin.table import KernelRecord
from . import protocol


@dataclass(frozen=True, slots=True)
class RawLaunch:
    args: tuple[bytes, ...]  # one buffer per parameter, in the record's order
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    # per device variable of the record (its `globals`, in order), its address in the AOT
    # module; 0: the shim does not know it
    addresses: tuple[int, ...] = ()


def decode_launch(record: KernelRecord, args: bytes, grid: tuple, block: tuple, globals_: bytes = b"") -> RawLaunch:
    """The launch the shim passed: `args` the parameters' bytes back to back (as the record
    sizes them), `globals_` a u64 address per device variable. Never raises on short bytes,
    so that no exception reaches C from here: a short argument fails Launch.check later (a
    counted failure), a missing address reads as 0 (unknown)."""
    raw, off = [], 0
    for p in record.params:
        raw.append(args[off : off + p.size])
        off += p.size
    n = len(record.globals)
    addresses = struct.unpack(f"<{n}Q", globals_[: 8 * n].ljust(8 * n, b"\0")) if n else ()
    return RawLaunch(tuple(raw), tuple(grid), tuple(block), addresses)


def decode_deferred(record: KernelRecord, earlier: bytes) -> Iterator[RawLaunch]:
    """The launches the shim kept for the tracker (protocol.DEFERRED each, then the launch's
    argument bytes), in order; a trailing partial record is ignored."""
    step = protocol.DEFERRED.size + sum(p.size for p in record.params)
    for at in range(0, len(earlier) - step + 1, step):
        dims = protocol.DEFERRED.unpack_from(earlier, at)
        yield decode_launch(record, earlier[at + protocol.DEFERRED.size : at + step], dims[:3], dims[3:])
