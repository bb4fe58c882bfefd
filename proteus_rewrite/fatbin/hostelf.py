"""Host ELF: the sections of an executable or shared library that hold GPU code.

lief does the ELF parsing; this module only picks out what proteus-rewrite needs and
returns it as plain data, so nothing else in the package touches lief objects.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field

import lief

from ..errors import FormatError, NotCudaBinaryError
from .layouts import ELF_MAGIC

lief.logging.disable()  # lief reports CUDA-specific ELF features on stderr; they are not errors here

# Sections that hold device code: CUDA fat binaries (linked and relocatable) and HIP offload bundles.
CUDA_FATBIN = ".nv_fatbin"
CUDA_RELFATBIN = "__nv_relfatbin"
CUDA_FATBIN_SEGMENT = ".nvFatBinSegment"
HIP_FATBIN = ".hip_fatbin"
MARKER_SECTION = ".proteus_rewrite"  # added by the rewriter (inject/), read by `inspect`
GPU_SECTIONS = (CUDA_FATBIN, CUDA_RELFATBIN, CUDA_FATBIN_SEGMENT, HIP_FATBIN, MARKER_SECTION)


@dataclass(frozen=True)
class Section:
    name: str
    offset: int  # file offset
    address: int  # virtual address (0 if not allocated)
    data: bytes = field(repr=False)


@dataclass(frozen=True)
class HostElf:
    machine: str
    file_type: str  # "EXEC" (non-PIE executable), "DYN" (PIE or shared library), ...
    is_pie: bool
    has_interpreter: bool
    needed: tuple[str, ...]
    runpath: tuple[str, ...]
    stripped: bool
    sections: dict[str, Section]

    @property
    def is_executable(self) -> bool:
        return self.file_type == "EXEC" or (self.file_type == "DYN" and self.has_interpreter)

    @property
    def cudart(self) -> str:
        """How the CUDA runtime is linked: 'dynamic' (libcudart in DT_NEEDED), 'static' (fat binaries
        registered with the runtime, whose wrappers live in .nvFatBinSegment) or 'none' (driver API only)."""
        if any(n.startswith("libcudart.so") for n in self.needed):
            return "dynamic"
        return "static" if CUDA_FATBIN_SEGMENT in self.sections else "none"


def parse(data: bytes) -> HostElf:
    """Parse a host ELF image. Raises NotCudaBinaryError for non-ELF input."""
    if data[:4] != ELF_MAGIC:
        raise NotCudaBinaryError("not an ELF file (no \\x7fELF magic)")
    config = lief.ELF.ParserConfig()
    # Only headers, sections and the dynamic table are needed; skipping the rest keeps a
    # 200 MB binary well under a second.
    config.parse_relocations = False
    config.parse_dyn_symbols = False
    config.parse_symbol_versions = False
    config.parse_notes = False
    config.parse_overlay = False
    config.parse_symtab_symbols = False
    binary = lief.ELF.parse(io.BytesIO(data), config)
    if binary is None:
        raise FormatError("corrupt or truncated ELF file (LIEF could not parse it)")
    hdr = binary.header
    table_end = hdr.section_header_offset + hdr.numberof_sections * hdr.section_header_size
    if table_end > len(data):
        raise FormatError(f"truncated ELF file: its section table ends at byte {table_end}, the file at {len(data)}")

    try:
        return _collect(binary, data)
    except FormatError:
        raise
    except (TypeError, ValueError, IndexError, OverflowError, UnicodeDecodeError, AttributeError) as exc:
        # LIEF hands back odd values for a mangled file (bytes for names, out-of-range enums)
        raise FormatError(f"corrupt ELF file ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def _enum_name(value) -> str:
    """LIEF gives an enum member, or a bare int for a value it does not know."""
    return getattr(value, "name", None) or f"unknown({int(value)})"


def _text(value) -> str:
    # LIEF hands back bytes, not str, for names that are not valid UTF-8 (seen when fuzzing).
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")


def _collect(binary, data: bytes) -> HostElf:
    # LIEF warns (RuntimeWarning, printed to stderr) for enum values it does not know, such as
    # a malformed e_type; those become "unknown(N)" here, and the user sees no stray warning.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _collect_fields(binary, data)


def _collect_fields(binary, data: bytes) -> HostElf:
    sections: dict[str, Section] = {}
    for sec in binary.sections:
        if not isinstance(sec.name, str) or sec.name not in GPU_SECTIONS or sec.name in sections:
            continue
        if sec.type == lief.ELF.Section.TYPE.NOBITS:
            continue
        end = sec.file_offset + sec.size
        if end > len(data):
            raise FormatError(f"section {sec.name} extends past the end of the file (truncated?)")
        sections[sec.name] = Section(sec.name, sec.file_offset, sec.virtual_address, data[sec.file_offset : end])

    needed, runpath = [], []
    for entry in binary.dynamic_entries:
        if isinstance(entry, lief.ELF.DynamicEntryLibrary):
            needed.append(_text(entry.name))
        elif isinstance(entry, (lief.ELF.DynamicEntryRunPath, lief.ELF.DynamicEntryRpath)):
            runpath.extend(_text(p) for p in entry.paths if p)

    return HostElf(
        machine=_enum_name(binary.header.machine_type),
        file_type=_enum_name(binary.header.file_type),
        is_pie=bool(binary.is_pie),
        has_interpreter=bool(binary.has_interpreter),
        needed=tuple(needed),
        runpath=tuple(runpath),
        stripped=binary.get_section(".symtab") is None,
        sections=sections,
    )
