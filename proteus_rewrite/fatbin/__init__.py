"""Binary formats, bytes -> plain dataclasses: one module per format.

hostelf   host ELF sections that carry GPU code (lief)
container CUDA fat binary containers
entry     fat binary entries and their decompression (zstd, LZ4)
cubin     device ELF: kernels, parameter records, embedded bitcode
ptx       PTX entry points and embedded bitcode
bitcode   LLVM bitcode: kernel signatures, globals, launch bounds, annotations
offload_bundle  clang offload bundles (HIP's .hip_fatbin), plain or CCOB-compressed
amdgpu_codeobj  AMDGPU code objects: target, kernarg layout (metadata note), embedded bitcode
kernels   the kernel table built from all of the above (hip: its HIP half)
table     the kernel table's records (plain data)
"""

from .table import KernelRecord, KernelTable, ModuleRecord, ParamRecord

__all__ = ["KernelRecord", "KernelTable", "ModuleRecord", "ParamRecord", "extract"]


def __getattr__(name: str):
    # The parsers import lief and llvmlite; the run time, which only reads stores, never needs them.
    if name == "extract":
        from .kernels import extract

        return extract
    raise AttributeError(name)
