"""The kernel table of a HIP executable: .hip_fatbin -> offload bundles -> AMDGPU code objects
-> embedded bitcode, as the same records a CUDA executable yields (kernels.py).

One FatbinRecord per bundle (one per translation unit: what __hipRegisterFatBinary is
handed), one EntryRecord per bundle entry, one ModuleRecord per distinct embedded module,
and one KernelRecord per kernel and processor, with `arch` the processor name ("gfx90a").
The code object's metadata note gives the authoritative argument layout (what the runtime
copies into the kernarg segment); only the explicit arguments become parameters, since the
runtime fills the hidden ones (grid sizes, offsets) itself.
"""

from __future__ import annotations

import dataclasses
import hashlib

from ..errors import FormatError
from . import amdgpu_codeobj as codeobj_mod
from . import common, hostelf
from . import offload_bundle as bundle_mod
from .table import EntryRecord, FatbinRecord, KernelRecord, KernelTable, ModuleRecord

# HIP's default launch bound (clang's --gpu-max-threads-per-block): every kernel without
# __launch_bounds__ carries it, so only other values are recorded as declared bounds.
DEFAULT_MAX_THREADS = 1024


def build(data: bytes, path: str, elf: hostelf.HostElf, progress=None) -> KernelTable:
    section = elf.sections[hostelf.HIP_FATBIN]
    bundles = bundle_mod.parse_section(section.data)
    warnings: list[str] = []
    fatbins: list[FatbinRecord] = []
    modules: list[ModuleRecord] = []
    module_index: dict[str, int] = {}
    device_code = []  # (bundle index, arch, code object, module index or None)

    for bi, b in enumerate(bundles):
        if progress:
            progress(bi, len(bundles))
        fatbins.append(FatbinRecord(
            index=bi,
            section=section.name,
            offset=b.offset,
            address=section.address + b.offset if section.address else 0,
            size=b.stored_size,
            sha256=b.digest,
            entries=tuple(
                EntryRecord(e.kind, e.arch or e.triple, b.compression, e.size, e.size,
                            hashlib.sha256(e.data).hexdigest() if e.is_code_object else "")
                for e in b.entries
            ),
        ))
        for e in b.code_objects:
            try:
                co = codeobj_mod.parse(e.data)
            except FormatError as exc:
                raise FormatError(f"offload bundle {bi}, entry {e.id}: {exc.message}") from None
            arch = co.arch or e.arch
            if not co.arch:
                warnings.append(
                    f"bundle {bi}: the {e.arch} code object names no processor in its ELF header (clang's "
                    "-fembed-bitcode driver step drops -target-cpu; docs/user/hip.md): the HIP runtime will not load it"
                )
            elif e.arch and co.arch != e.arch:
                warnings.append(f"bundle {bi}: entry {e.id} holds a code object for {co.arch}")
            mod = None
            if co.bitcode:
                digest = hashlib.sha256(co.bitcode).hexdigest()
                if digest not in module_index:
                    module_index[digest] = len(modules)
                    modules.append(ModuleRecord(len(modules), digest, arch, bi, "", "", co.cmdline, co.bitcode))
                mod = module_index[digest]
            device_code.append((bi, arch, co, mod))

    analyses = common.analyze_isolated([m.code for m in modules])
    modules = [dataclasses.replace(m, source_filename=a.source_filename, triple=a.triple) for m, a in zip(modules, analyses)]
    kernels: list[KernelRecord] = []
    for bi, arch, co, mod in device_code:
        for meta in co.metadata.kernels:
            bk = analyses[mod].kernels.get(meta.name) if mod is not None else None
            params = common.merge_params(meta.name, meta.params, bk, warnings)
            declared = meta.max_flat_workgroup_size
            kernels.append(KernelRecord(
                name=meta.name,
                demangled=common.demangle(meta.name),
                fatbin=bi,
                arch=arch,
                module=mod if bk is not None else None,
                link_modules=(),
                params=params,
                param_size=meta.param_size,
                globals=bk.globals if bk else (),
                max_threads=(declared, 1, 1) if declared and declared != DEFAULT_MAX_THREADS else None,
                min_ctas=None,
                jit_args=bk.jit_args if bk else None,
                layout_source="codeobj",
            ))
    if progress:
        progress(len(bundles), len(bundles))

    missing = [x for x in kernels if not x.has_bitcode]
    if missing and len(missing) < len(kernels):
        names = ", ".join(sorted({x.demangled for x in missing})[:5])
        warnings.append(f"{len(missing)} of {len(kernels)} kernels have no embedded bitcode and will run unspecialized: {names}")

    app = dataclasses.replace(common.hostelf_app_info(path, data, elf), cudart="none", rdc=False, platform="hip")
    return KernelTable(app=app, fatbins=tuple(fatbins), modules=tuple(modules), kernels=tuple(kernels),
                       warnings=tuple(warnings))
