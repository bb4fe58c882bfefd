"""The kernel table's records: plain data, shared by the extractor, the store and the run
time (which must not pay for importing the binary parsers)."""

from __future__ import annotations

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
    arch: int  # SM version of the device code that defines the layout
    module: int | None  # index into KernelTable.modules; None when no bitcode defines it
    link_modules: tuple[int, ...]  # other modules to link with it (-fgpu-rdc)
    params: tuple[ParamRecord, ...]
    param_size: int
    globals: tuple[str, ...]  # device variables it reaches
    max_threads: tuple[int, int, int] | None  # __launch_bounds__ (max threads per block)
    min_ctas: int | None  # __launch_bounds__ (min blocks per SM)
    jit_args: tuple[int, ...] | None  # annotate("jit", ...) indices, 1-based
    layout_source: str  # "cubin" or "ptx"

    @property
    def has_bitcode(self) -> bool:
        return self.module is not None


@dataclass(frozen=True)
class ModuleRecord:
    index: int
    sha256: str
    arch: int
    fatbin: int
    source_filename: str
    triple: str
    cmdline: tuple[str, ...]
    bitcode: bytes = field(repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.bitcode)


@dataclass(frozen=True)
class EntryRecord:
    kind: str
    arch: int
    compression: str
    stored_size: int
    size: int
    sha256: str = ""  # of the decompressed cubin: matches an app that loads the cubin itself


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


@dataclass(frozen=True)
class KernelTable:
    app: AppInfo
    fatbins: tuple[FatbinRecord, ...]
    modules: tuple[ModuleRecord, ...]
    kernels: tuple[KernelRecord, ...]
    warnings: tuple[str, ...]

    @property
    def kernels_with_bitcode(self) -> list[KernelRecord]:
        return [k for k in self.kernels if k.has_bitcode]
