"""Every magic number and fixed header of the formats proteus-rewrite reads, declared once
(as pyelftools' structs.py serves its parsers). The format modules parse with these, and the
run time, which must not import the parsers' libraries on an app's launch path, finds the extent
of an image in the app's memory with `image_extent`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

ELF_MAGIC = b"\x7fELF"

# CUDA: the fat binary container (.nv_fatbin) and the wrapper __cudaRegisterFatBinary takes:
#   u32 magic, u16 version, u16 header size, u64 size of the entries
FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")
#   the wrapper: u32 magic, u32 version, u64 address of the container (then a filename pointer)
FATBIN_WRAPPER_MAGIC = 0x466243B1
WRAPPER = struct.Struct("<IIQ")
# compressed fat binary entries
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

# HIP: clang's offload bundle (.hip_fatbin), plain or compressed, and __hip_fatbin_wrapper ("HIPF")
OFFLOAD_BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"
HIP_WRAPPER_MAGIC = 0x48495046

Reader = Callable[[int, int], bytes]  # read(offset, n) -> n bytes from an image's start


def image_extent(read: Reader) -> tuple[str, int, Reader] | None:
    """What a loaded image in memory is and how many bytes it spans, reading no more than its
    headers: ("fatbin" | "bundle" | "elf", size, the reader of the image itself: a wrapper's
    points elsewhere). None when it is none of them."""
    magic = read(0, 4)
    (word,) = struct.unpack("<I", magic)
    if word in (FATBIN_WRAPPER_MAGIC, HIP_WRAPPER_MAGIC):
        address = WRAPPER.unpack(read(0, WRAPPER.size))[2]
        import ctypes

        def inner(off: int, n: int) -> bytes:
            return ctypes.string_at(address + off, n)

        read = inner
        magic = read(0, 4)
        (word,) = struct.unpack("<I", magic)
    if magic in (OFFLOAD_BUNDLE_MAGIC[:4], CCOB_MAGIC):
        from .offload_bundle import stored_size

        return "bundle", stored_size(read), read
    if word == FATBIN_MAGIC:
        _, _, header_size, size = FATBIN_HEADER.unpack(read(0, FATBIN_HEADER.size))
        return "fatbin", header_size + size, read
    if magic == ELF_MAGIC:
        from .cubin import image_size

        return "elf", image_size(read(0, 64)), read
    return None
