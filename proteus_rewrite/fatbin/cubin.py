"""Cubin (CUDA device ELF): kernels, their parameter records, device variables and the
LLVM bitcode clang embeds with -fembed-bitcode.

What is read, and where:
- kernels: FUNC symbols marked as entries (st_other bit 0x10, STO_CUDA_ENTRY);
- parameters: the kernel's `.nv.info.<kernel>` attribute records. Each record is
  u8 format, u8 attribute, u16 value-or-length (format 4 = EIFMT_SVAL has a payload of that
  length). EIATTR_KPARAM_INFO (0x17) payload: u32 index, u16 ordinal, u16 offset, u32 packed
  with the size in bits 18..31. EIATTR_CBANK_PARAM_SIZE (0x19) is the total parameter size,
  EIATTR_MAX_THREADS (0x05) / EIATTR_REQNTID (0x10) the launch bounds (3 x u32);
- bitcode: local OBJECT symbols `llvm_$_embedded_$_module` / `llvm_$_cmdline` (value = offset in
  their section, normally `.nv.global.init`). A device-linked (-fgpu-rdc) cubin has one pair per
  translation unit;
- device variables: other OBJECT symbols in `.nv.global*` / `.nv.constant*` sections.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import warnings
from dataclasses import dataclass, field

from ..errors import FormatError
from . import elf64

EMBEDDED_MODULE = "llvm_$_embedded_$_module"
EMBEDDED_CMDLINE = "llvm_$_cmdline"

STO_CUDA_ENTRY = 0x10
STT_OBJECT = 1
STT_FUNC = 2

EIFMT_SVAL = 4
EIATTR_MAX_THREADS = 0x05
EIATTR_REQNTID = 0x10
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_REGCOUNT = 0x2F
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12


@dataclass(frozen=True)
class CubinParam:
    ordinal: int
    offset: int
    size: int


@dataclass(frozen=True)
class CubinKernel:
    name: str
    params: tuple[CubinParam, ...]  # by ordinal
    param_size: int | None
    max_threads: tuple[int, int, int] | None  # __launch_bounds__ / .maxntid
    reqntid: tuple[int, int, int] | None
    registers: int | None = None  # per thread, as ptxas allocated them (.nv.info EIATTR_REGCOUNT)
    # bytes of local memory per thread, callees included (EIATTR_MIN_STACK_SIZE, else the frame):
    # local arrays plus what ptxas spilled
    stack: int | None = None


@dataclass(frozen=True)
class EmbeddedModule:
    bitcode: bytes = field(repr=False)
    cmdline: tuple[str, ...]


@dataclass(frozen=True)
class DeviceVariable:
    name: str
    size: int
    section: str


@dataclass(frozen=True)
class Cubin:
    relocatable: bool
    kernels: dict[str, CubinKernel]
    modules: tuple[EmbeddedModule, ...]
    variables: tuple[DeviceVariable, ...]


def image_size(header: bytes) -> int:
    """Bytes an ELF64 image spans, from its header alone (section and program header tables
    last): how much of a cubin in memory to hash."""
    shoff, = struct.unpack_from("<Q", header, 0x28)
    phoff, = struct.unpack_from("<Q", header, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
    return max(shoff + shentsize * shnum, phoff + phentsize * phnum)


def parse(data: bytes) -> Cubin:
    if data[:4] != b"\x7fELF":
        raise FormatError("cubin entry is not an ELF image")
    try:
        # LIEF warns (a RuntimeWarning on stderr) for enum values it does not know, such as a
        # mangled section type; the checks below judge the image, the user sees no stray warning.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return _parse(data)
    except FormatError:
        raise
    except (TypeError, ValueError, IndexError, OverflowError, UnicodeDecodeError, AttributeError, struct.error) as exc:
        # LIEF hands back odd values for a mangled image (bytes for names, out-of-range enums)
        raise FormatError(f"corrupt cubin ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def _name(value) -> str:
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")


def _parse(data: bytes) -> Cubin:
    import lief  # here, not at the top: the run time uses image_size() and must not load LIEF

    lief.logging.disable()  # LIEF reports CUDA-specific ELF features on stderr; they are not errors
    if data[:4] != b"\x7fELF":
        raise FormatError("cubin entry is not an ELF image")
    elf = lief.ELF.parse(io.BytesIO(data))
    if elf is None:
        raise FormatError("cubin entry is a corrupt ELF image")
    sections = list(elf.sections)

    def section_bytes(index: int) -> tuple[str, bytes]:
        if not 0 < index < len(sections):
            raise FormatError(f"cubin symbol refers to section #{index}, which does not exist")
        sec = sections[index]
        if sec.type == lief.ELF.Section.TYPE.NOBITS:
            return _name(sec.name), b""
        if sec.file_offset + sec.size > len(data):
            raise FormatError(f"cubin section {_name(sec.name)} runs past the end of the image")
        return _name(sec.name), data[sec.file_offset : sec.file_offset + sec.size]

    info_sections = {_name(s.name)[len(".nv.info.") :]: s for s in sections if _name(s.name).startswith(".nv.info.")}
    usage = resources(data)
    modules_raw: list[bytes] = []
    cmdlines: list[tuple[str, ...]] = []
    kernels: dict[str, CubinKernel] = {}
    variables: list[DeviceVariable] = []

    for sym in elf.symbols:
        st_type = sym.information & 0xF
        name = _name(sym.name)
        if st_type == STT_FUNC and sym.other & STO_CUDA_ENTRY:
            kernels[name] = dataclasses.replace(_kernel(name, info_sections.get(name), data), registers=_count(usage.get(name)),
                                                stack=usage[name].stack if name in usage else None)
        elif st_type != STT_OBJECT or not name:
            continue
        elif name in (EMBEDDED_MODULE, EMBEDDED_CMDLINE):
            sec_name, content = section_bytes(sym.shndx)
            if sym.value + sym.size > len(content):
                raise FormatError(f"cubin symbol {name} lies outside its section {sec_name}")
            blob = content[sym.value : sym.value + sym.size]
            if name == EMBEDDED_MODULE:
                modules_raw.append(blob)
            else:
                cmdlines.append(tuple(a.decode("utf-8", "replace") for a in blob.split(b"\0") if a))
        elif 0 < sym.shndx < len(sections):
            sec_name = _name(sections[sym.shndx].name)
            if sec_name.startswith((".nv.global", ".nv.constant")):
                variables.append(DeviceVariable(name, sym.size, sec_name))

    # Each translation unit contributes one module and one command line, in the same order.
    modules = tuple(
        EmbeddedModule(bc, cmdlines[i] if i < len(cmdlines) else ()) for i, bc in enumerate(modules_raw)
    )
    return Cubin(
        relocatable=struct.unpack_from("<H", data, 16)[0] == 1,  # e_type ET_REL (LIEF warns on unknown types)
        kernels=kernels,
        modules=modules,
        variables=tuple(variables),
    )


def _kernel(name: str, info, data: bytes) -> CubinKernel:
    params: dict[int, CubinParam] = {}
    param_size = max_threads = reqntid = None
    if info is not None:
        raw = data[info.file_offset : info.file_offset + info.size]
        if len(raw) != info.size:
            raise FormatError(f"cubin section .nv.info.{name} runs past the end of the image")
        for attr, payload, value in _attributes(raw, name):
            if attr == EIATTR_KPARAM_INFO and len(payload) >= 12:
                _index, ordinal, offset, packed = struct.unpack_from("<IHHI", payload)
                params[ordinal] = CubinParam(ordinal, offset, (packed >> 18) & 0x3FFF)
            elif attr == EIATTR_CBANK_PARAM_SIZE:
                param_size = value
            elif attr == EIATTR_MAX_THREADS and len(payload) >= 12:
                max_threads = struct.unpack_from("<III", payload)
            elif attr == EIATTR_REQNTID and len(payload) >= 12:
                reqntid = struct.unpack_from("<III", payload)
    return CubinKernel(name, tuple(params[k] for k in sorted(params)), param_size, max_threads, reqntid)


def _attributes(raw: bytes, name: str):
    """Yield (attribute, payload, value) for each record of an .nv.info section."""
    pos = 0
    while pos + 4 <= len(raw):
        fmt, attr, value = struct.unpack_from("<BBH", raw, pos)
        pos += 4
        payload = b""
        if fmt == EIFMT_SVAL:
            if pos + value > len(raw):
                raise FormatError(f"cubin section .nv.info.{name}: attribute {attr:#x} runs past the section")
            payload = raw[pos : pos + value]
            pos += value
        yield attr, payload, value


def _count(r: Resources | None) -> int | None:
    return r.registers if r is not None and r.registers and r.registers <= 255 else None


@dataclass(frozen=True)
class Resources:
    registers: int | None
    stack: int | None


def resources(data: bytes) -> dict[str, Resources]:
    """Function name -> registers and stack bytes per thread, read from the ELF section headers
    with struct alone: the compiler checks each variant it makes, and importing LIEF for that
    cost 0.4 s in a fresh compiler process."""
    try:
        headers = elf64.sections(data)
        info = next((h for h in headers if elf64.section_name(data, headers, h) == ".nv.info"), None)
        names = [name for name, *_ in elf64.symbols(data, headers)]
        if not names or info is None:
            return {}
        found: dict[str, dict[int, int]] = {}
        for attr, payload, _value in _attributes(elf64.body(data, info), ".nv.info"):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE) and len(payload) >= 8:
                index, value = struct.unpack_from("<II", payload)
                if 0 <= index < len(names):
                    found.setdefault(names[index], {})[attr] = value
    except (struct.error, IndexError, ValueError) as exc:
        raise FormatError(f"cubin: malformed ELF ({exc})") from None
    return {name: Resources(a.get(EIATTR_REGCOUNT), a.get(EIATTR_MIN_STACK_SIZE, a.get(EIATTR_FRAME_SIZE)))
            for name, a in found.items()}
