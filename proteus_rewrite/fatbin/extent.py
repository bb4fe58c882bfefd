"""How far a loaded image reaches in the app's memory, read from its headers alone: what the run
time hashes to match an image to a recorded fat binary (runtime/session.py).

Not in layouts.py: it needs the format modules' readers, and they import layouts.py's
constants. A format module is imported only for an image of its kind, so that an app's launch
path loads no parser library it does not need (offload_bundle.py's zstandard on CUDA)."""

from __future__ import annotations

import struct
from collections.abc import Callable

from . import layouts

Reader = Callable[[int, int], bytes]  # read(offset, n) -> n bytes from an image's start


def image_extent(read: Reader) -> tuple[str, int, Reader] | None:
    """What a loaded image in memory is and how many bytes it spans, reading no more than its
    headers: ("fatbin" | "bundle" | "elf", size, the reader of the image itself: a wrapper's
    points elsewhere). None when it is none of them."""
    magic = read(0, 4)
    (word,) = struct.unpack("<I", magic)
    if word in (layouts.FATBIN_WRAPPER_MAGIC, layouts.HIP_WRAPPER_MAGIC):
        address = layouts.WRAPPER.unpack(read(0, layouts.WRAPPER.size))[2]
        import ctypes

        def inner(off: int, n: int) -> bytes:
            return ctypes.string_at(address + off, n)

        read = inner
        magic = read(0, 4)
        (word,) = struct.unpack("<I", magic)
    if magic in (layouts.OFFLOAD_BUNDLE_MAGIC[:4], layouts.CCOB_MAGIC):
        from .offload_bundle import stored_size

        return "bundle", stored_size(read), read
    if word == layouts.FATBIN_MAGIC:
        _, _, header_size, size = layouts.FATBIN_HEADER.unpack(read(0, layouts.FATBIN_HEADER.size))
        return "fatbin", header_size + size, read
    if magic == layouts.ELF_MAGIC:
        from .cubin import image_size

        return "elf", image_size(read(0, 64)), read
    return None
