"""The kernel table: every kernel of an executable with its parameter layout and bitcode.

Combines the per-format parsers: host ELF -> fat binary containers -> entries -> cubin
(or PTX) -> embedded bitcode. HIP executables (.hip_fatbin) take the same road through
offload bundles and AMDGPU code objects (hip.py) and yield the same records; what both roads share
is in common.py. The device code gives the authoritative parameter layout
(what the CUDA runtime copies at launch); the bitcode gives each parameter's LLVM type.

-fgpu-rdc builds: each object carries its relocatable fat binary in `__nv_relfatbin`, and
the device link (nvcc -dlink) adds one linked container to `.nv_fatbin`, whose cubin holds
one embedded module per translation unit. Only `.nv_fatbin` is launched from, so that is
what is recorded; a kernel's `link_modules` name the other translation units' modules the
JIT must link with it (a kernel may call device functions defined elsewhere).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable

from ..errors import FormatError, InputError, NotCudaBinaryError, ProteusError
from . import container as container_mod
from . import cubin as cubin_mod
from . import hip, hostelf
from . import ptx as ptx_mod
from . import recipe as recipe_mod
from .common import analyze_isolated, demangle, hostelf_app_info, merge_params, params_end
from .entry import Kind

# the records, importable from here too (the kernel table is this module's product)
from .table import AppInfo, EntryRecord, FatbinRecord, KernelRecord, KernelTable, ModuleRecord, ParamRecord  # noqa: F401

Progress = Callable[[int, int], None]


def read_input(path: str | os.PathLike) -> bytes:
    """Read the input file, turning OS errors into one-line InputErrors."""
    p = os.fspath(path)
    if os.path.isdir(p):
        raise InputError("is a directory, not an executable", p)
    try:
        with open(p, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise InputError("no such file", p) from None
    except PermissionError:
        raise InputError("permission denied", p) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", p) from None


def extract(path: str | os.PathLike, progress: Progress | None = None) -> KernelTable:
    """Open an executable and build its kernel table. Errors carry the path."""
    p = os.fspath(path)
    data = read_input(p)
    try:
        return build(data, p, progress)
    except ProteusError as exc:
        if exc.path is None:
            exc.path = p
        raise


def build(data: bytes, path: str, progress: Progress | None = None, prefer_ptx: bool = False) -> KernelTable:
    """The kernel table of an executable's or library's bytes; prefer_ptx: a kernel carrying both
    bitcode and PTX is recorded from its PTX (to compare the two routes on one binary)."""
    elf = hostelf.parse(data)
    section = elf.sections.get(hostelf.CUDA_FATBIN)
    if section is None:
        if hostelf.HIP_FATBIN in elf.sections:
            return hip.build(data, path, elf, progress)
        if hostelf.CUDA_RELFATBIN in elf.sections:
            raise NotCudaBinaryError(
                "only relocatable device code (__nv_relfatbin) and no device-linked .nv_fatbin: "
                "link the -fgpu-rdc objects with a device link step (nvcc -dlink)"
            )
        raise NotCudaBinaryError("no .nv_fatbin section: not a CUDA executable (or its GPU code was stripped)")

    containers = container_mod.parse_section(section.data)
    warnings: list[str] = []
    fatbins: list[FatbinRecord] = []
    modules: list[ModuleRecord] = []
    module_index: dict[str, int] = {}  # sha256 -> index: identical bitcode (cubin and PTX copies) is stored once
    device_code = []  # (container index, arch, cubin, ptx, module indices)

    for ci, cont in enumerate(containers):
        if progress:
            progress(ci, len(containers))
        fatbins.append(
            FatbinRecord(
                index=ci,
                section=section.name,
                offset=cont.offset,
                address=section.address + cont.offset if section.address else 0,
                size=cont.header_size + cont.size,
                sha256=cont.digest,
                entries=tuple(
                    EntryRecord(e.kind_name, e.arch, e.compression, e.payload_size, e.uncompressed_size or e.payload_size,
                                _cubin_digest(e.payload()) if e.kind == Kind.ELF else "")
                    for e in cont.entries
                ),
            )
        )
        for arch, cubin, ptx in _device_code_by_arch(cont):
            mod_ids = []
            for emb in (cubin.modules if cubin else ()) or (ptx.modules if ptx else ()):
                digest = hashlib.sha256(emb.bitcode).hexdigest()
                if digest not in module_index:
                    module_index[digest] = len(modules)
                    modules.append(ModuleRecord(len(modules), digest, arch, ci, "", "", emb.cmdline, emb.bitcode,
                                                ptx.target if ptx else None))
                mod_ids.append(module_index[digest])
            device_code.append((ci, arch, cubin, ptx, mod_ids))

    relocatable = _relocatable_ptx(elf)
    analyses = analyze_isolated([m.code for m in modules])
    modules = [dataclasses.replace(m, source_filename=a.source_filename, triple=a.triple) for m, a in zip(modules, analyses)]
    kernels: list[KernelRecord] = []
    for ci, arch, cubin, ptx, mod_ids in device_code:
        layouts = cubin.kernels if cubin and cubin.kernels else (ptx.entries if ptx else {})
        source = "cubin" if cubin and cubin.kernels else "ptx"
        ptx_kernels: dict[str, ptx_mod.PtxKernel] | None = None
        for name, layout in layouts.items():
            defining = next((i for i in mod_ids if name in analyses[i].kernels), None)
            bk = analyses[defining].kernels[name] if defining is not None else None
            params = merge_params(name, layout.params, bk, warnings)
            if (defining is None or prefer_ptx) and ptx is not None and name in ptx.entries:
                if ptx_kernels is None:
                    ptx_kernels = _analyze_ptx(ptx, warnings)
                found = (ptx, ptx_kernels.get(name))
            elif defining is None:
                found = _relocatable_for(relocatable, name, arch)  # -rdc: its translation unit's PTX
            else:
                found = (None, None)
            code, pk = found
            if pk is not None and pk.unresolved:
                warnings.append(f"{demangle(name)} calls device code of another translation unit "
                                f"({', '.join(pk.unresolved[:3])}) that no unit's PTX defines alike: it runs as built")
            elif pk is not None and (typed := ptx_params(pk, params)) is None:
                warnings.append(f"{demangle(name)}: its PTX declares {len(pk.params)} parameters of other sizes than "
                                f"its machine code's {len(params)}: it runs as built")
            elif pk is not None:
                digest = hashlib.sha256(code.source).hexdigest()
                if digest not in module_index:
                    module_index[digest] = len(modules)
                    modules.append(ModuleRecord(len(modules), digest, arch, ci, "", "", (), code.source,
                                                code.target, kind="ptx"))
                kernels.append(_record(name, ci, arch, module_index[digest], typed, layout, source, None,
                                       pk.variables, "ptx"))
                continue
            kernels.append(_record(name, ci, arch, defining, params, layout, source, bk, None, "bitcode",
                                   tuple(i for i in mod_ids if i != defining) if defining is not None else ()))
    if progress:
        progress(len(containers), len(containers))

    handicapped = next((m for m in modules if m.kind == "bitcode" and m.recipe.problem), None)
    if handicapped is not None:  # once per app: every module of a build shares its recipe
        warnings.append(recipe_mod.advice(os.path.basename(path), handicapped.recipe))
    missing = [k for k in kernels if not k.specializable]
    if missing and len(missing) < len(kernels):
        names = ", ".join(sorted({k.demangled for k in missing})[:5])
        warnings.append(f"{len(missing)} of {len(kernels)} kernels have neither embedded bitcode nor PTX for their "
                        f"architecture and will run unspecialized: {names}")

    return KernelTable(
        app=hostelf_app_info(path, data, elf),
        fatbins=tuple(fatbins),
        modules=tuple(modules),
        kernels=tuple(kernels),
        warnings=tuple(warnings),
    )


def _record(name, ci, arch, module, params, layout, source, bk, variables, code, link_modules=()) -> KernelRecord:
    return KernelRecord(
        name=name,
        demangled=demangle(name),
        fatbin=ci,
        arch=arch,
        module=module,
        link_modules=link_modules,
        params=params,
        param_size=layout.param_size if layout.param_size is not None else params_end(params),
        globals=bk.globals if bk else (variables or ()),
        max_threads=layout.max_threads or (bk.max_threads if bk else None),
        min_ctas=(bk.min_ctas if bk else None) or getattr(layout, "min_ctas", None),
        jit_args=bk.jit_args if bk else None,
        layout_source=source,
        aot_registers=getattr(layout, "registers", None),
        code=code,
    )


def _relocatable_ptx(elf) -> dict[str, list[tuple[int, ptx_mod.Ptx, ptx_mod.PtxKernel]]]:
    """nvcc -rdc=true: the launched cubin is device-linked and carries no PTX; each translation
    unit's relocatable PTX is in `__nv_relfatbin`. Entry name -> [(the PTX's architecture, its
    PTX, its analysis)]: its unit's, or, where it calls device code of other units, its unit
    with those definitions linked in (ptx.link, over the units of that architecture)."""
    section = elf.sections.get(hostelf.CUDA_RELFATBIN)
    if section is None:
        return {}
    try:
        containers = container_mod.parse_section(section.data)
    except FormatError:
        return {}  # what is launched is read from .nv_fatbin; without this the kernels run as built
    by_arch: dict[int, list[ptx_mod.Ptx]] = {}
    for cont in containers:
        for e in cont.entries:
            if e.kind == Kind.PTX:
                try:
                    by_arch.setdefault(e.arch, []).append(ptx_mod.parse(e.payload()))
                except FormatError:
                    continue
    out: dict[str, list[tuple[int, ptx_mod.Ptx, ptx_mod.PtxKernel]]] = {}
    for arch, units in by_arch.items():
        texts = [u.source.decode("utf-8", "replace") for u in units]
        for home, unit in enumerate(units):
            try:
                analyzed = ptx_mod.analyze(unit.source)
            except FormatError:
                continue
            for name, pk in analyzed.items():
                found = (arch, unit, pk)
                if pk.unresolved:
                    try:
                        linked = ptx_mod.link(texts, home, name)
                        lk = ptx_mod.analyze(linked.encode())[name] if linked is not None else None
                    except FormatError:
                        lk = None
                    if lk is not None and not lk.unresolved:
                        found = (arch, dataclasses.replace(unit, source=linked.encode()), lk)
                out.setdefault(name, []).append(found)
    return out


def _relocatable_for(relocatable, name: str, arch: int):
    """The relocatable PTX of `name` for a cubin of `arch`: the newest not above it (PTX of a
    newer architecture, as libcudadevrt ships, does not assemble for it)."""
    fits = [f for f in relocatable.get(name, ()) if f[0] <= arch]
    best = max(fits, key=lambda f: f[0], default=None)
    return (best[1], best[2]) if best else (None, None)


def _analyze_ptx(ptx: ptx_mod.Ptx, warnings: list[str]) -> dict[str, ptx_mod.PtxKernel]:
    try:
        return ptx_mod.analyze(ptx.source)
    except FormatError as exc:
        warnings.append(f"PTX {ptx.target or ''}: {exc.message}; its kernels will run unspecialized")
        return {}


def ptx_params(pk: ptx_mod.PtxKernel, layout: tuple[ParamRecord, ...]) -> tuple[ParamRecord, ...] | None:
    """The parameters of a PTX-route kernel: the device code's layout (what the launch copies)
    with the kinds its PTX gives; None when the two disagree (then it is not specialized). The
    offsets may differ: ptxas aligns a parameter to its `.align` in the constant bank, whose
    parameter area does not start on a 64-byte boundary, and the fold reads each parameter's
    own bytes, so only the sizes must agree."""
    if len(pk.params) != len(layout) or any(p.size != q.size for p, q in zip(pk.params, layout)):
        return None
    return tuple(dataclasses.replace(q, kind=kind, llvm_type=llvm_type) for q, (kind, llvm_type) in zip(layout, pk.kinds))


def _cubin_digest(payload: bytes) -> str:
    """SHA-256 of the cubin proper (the fat binary may pad it), as the run time hashes it."""
    size = cubin_mod.image_size(payload[:64]) if len(payload) >= 64 else len(payload)
    return hashlib.sha256(payload[:size]).hexdigest()


def _device_code_by_arch(cont: container_mod.Container):
    """Yield (arch, cubin or None, ptx or None) for each architecture in a container."""
    by_arch: dict[int, dict[int, object]] = {}
    for e in cont.entries:
        if e.kind not in (Kind.ELF, Kind.PTX):
            continue
        slot = by_arch.setdefault(e.arch, {})
        if e.kind in slot:  # a second image of the same kind and arch adds nothing we use
            continue
        payload = e.payload()
        try:
            slot[e.kind] = cubin_mod.parse(payload) if e.kind == Kind.ELF else ptx_mod.parse(payload)
        except FormatError as exc:
            raise FormatError(f"fatbin entry at offset {e.offset:#x} ({e.kind_name} sm_{e.arch}): {exc.message}") from None
    for arch in sorted(by_arch):
        yield arch, by_arch[arch].get(Kind.ELF), by_arch[arch].get(Kind.PTX)


