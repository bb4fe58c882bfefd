"""Every magic number and fixed header of the formats proteus-rewrite reads, declared once
(as pyelftools' structs.py serves its parsers). The format modules parse with these; extent.py
finds with them how far an image in the app's memory reaches. Constants only: every format
module imports this one, and this one imports none of them.
"""

from __future__ import annotations

import struct

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
