"""The kernel table's records: plain data, shared by the extractor, the store and the run
time (which must not pay for importing the binary parsers)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParamRecord:
    index: int
    kind: str  # int | float | pointer | aggregate | vector | other | unknown (no bitcode)
    llvm_type: str | None
    size: int
    offset: int
    align: int
    byval: bool = False


@dataclass(frozen=True)
class KernelRecord:
    name: str
    demangled: str
    fatbin: int  # index into KernelTable.fatbins
    arch: int | str  # SM version (CUDA, e.g. 90) or AMDGPU processor (HIP, e.g. "gfx90a") of its device code
    module: int | None  # index into KernelTable.modules; None when no bitcode defines it
    link_modules: tuple[int, ...]  # other modules to link with it (-fgpu-rdc)
    params: tuple[ParamRecord, ...]
    param_size: int
    globals: tuple[str, ...]  # device variables it reaches
    max_threads: tuple[int, int, int] | None  # __launch_bounds__ (max threads per block)
    min_ctas: int | None  # __launch_bounds__ (min blocks per SM)
    jit_args: tuple[int, ...] | None  # annotate("jit", ...) indices, 1-based
    layout_source: str  # "cubin", "ptx" or "codeobj" (an AMDGPU code object's metadata note)
    aot_registers: int | None = None  # registers per thread of the AOT cubin's code (CUDA; None: unknown)
    # what its module is: "bitcode" (LLVM, embedded by clang) or "ptx" (the PTX an nvcc build
    # carries beside the SASS): which route specializes it
    code: str = "bitcode"

    @property
    def specializable(self) -> bool:
        return self.module is not None

    @property
    def has_bitcode(self) -> bool:
        return self.module is not None and self.code == "bitcode"


@dataclass(frozen=True)
class ModuleRecord:
    index: int
    sha256: str
    arch: int | str
    fatbin: int
    source_filename: str
    triple: str
    cmdline: tuple[str, ...]
    code: bytes = field(repr=False, compare=False)  # LLVM bitcode, or PTX text (kind)
    ptx_target: str | None = None  # the `.target` of the PTX its compilation put beside it (CUDA)
    kind: str = "bitcode"  # "bitcode" or "ptx"

    @property
    def size(self) -> int:
        return len(self.code)

    @property
    def recipe(self):
        """How it was built (fatbin/recipe.py), from its command line and PTX."""
        from .recipe import classify

        return classify(self.cmdline, self.triple, self.ptx_target, self.arch)


@dataclass(frozen=True)
class EntryRecord:
    kind: str  # CUDA: ELF, PTX, ...; HIP: the offload bundle entry's kind (hipv4, host)
    arch: int | str
    compression: str
    stored_size: int
    size: int
    sha256: str = ""  # of the decompressed cubin or code object: matches an app that loads it itself


@dataclass(frozen=True)
class FatbinRecord:
    index: int
    section: str
    offset: int  # in the section
    address: int  # virtual address of the container in the unrelocated image
    size: int
    sha256: str  # of the container bytes: how the shim recognizes it when it is registered
    entries: tuple[EntryRecord, ...]


@dataclass(frozen=True)
class AppInfo:
    name: str
    path: str
    sha256: str
    size: int
    file_type: str
    pie: bool
    stripped: bool
    cudart: str
    rdc: bool
    rewritten: dict | None = None  # the .proteus_rewrite record, when the input is itself a rewritten app
    platform: str = "cuda"  # "cuda" (.nv_fatbin) or "hip" (.hip_fatbin)


def arch_name(arch: int | str) -> str:
    """How a target is written: sm_90 for CUDA's SM versions, gfx90a for AMDGPU processors."""
    return f"sm_{arch}" if isinstance(arch, int) else arch


@dataclass(frozen=True)
class KernelTable:
    app: AppInfo
    fatbins: tuple[FatbinRecord, ...]
    modules: tuple[ModuleRecord, ...]
    kernels: tuple[KernelRecord, ...]
    warnings: tuple[str, ...]
    # kernel name -> why `proteus-rewrite APP --validate` denied it (runtime/validate.py): never specialized
    denied: dict = dataclasses.field(default_factory=dict)

    def fatbin(self, index: int) -> FatbinRecord | None:
        """The fat binary recorded under `index`."""
        return next((f for f in self.fatbins if f.index == index), None)

    @property
    def kernels_with_bitcode(self) -> list[KernelRecord]:
        return [k for k in self.kernels if k.has_bitcode]

    @property
    def kernels_specializable(self) -> list[KernelRecord]:
        """Kernels with code to specialize: bitcode, or (nvcc builds) PTX."""
        return [k for k in self.kernels if k.specializable]
