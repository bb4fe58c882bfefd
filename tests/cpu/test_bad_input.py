"""Bad input: one line on stderr naming the file and the reason, a documented exit code,
no traceback, and the input left exactly as it was."""

from __future__ import annotations

import hashlib
import shutil
import struct

import pytest

from proteus_rewrite.fatbin import container, hostelf

from ..conftest import run_cli


def _fatbin_offset(path) -> int:
    return hostelf.parse(path.read_bytes()).sections[".nv_fatbin"].offset


def _patch(src, dst, offset: int, data: bytes):
    shutil.copy(src, dst)
    with open(dst, "r+b") as f:
        f.seek(offset)
        f.write(data)
    return dst


def _case_missing(samples, tmp):
    return tmp / "does-not-exist"


def _case_directory(samples, tmp):
    return tmp


def _case_not_elf(samples, tmp):
    p = tmp / "notes.txt"
    p.write_text("just some text\n")
    return p


def _case_empty(samples, tmp):
    p = tmp / "empty"
    p.write_bytes(b"")
    return p


def _case_truncated_elf(samples, tmp):
    p = tmp / "truncated"
    p.write_bytes((samples / "loop_count").read_bytes()[:5000])
    return p


def _case_no_fatbin(samples, tmp):
    return shutil.copy("/bin/true", tmp / "true")


def _case_fatbin_size_too_big(samples, tmp):
    src = samples / "loop_count"
    return _patch(src, tmp / "bigsize", _fatbin_offset(src) + 8, struct.pack("<Q", 1 << 40))


def _case_bad_container_magic(samples, tmp):
    src = samples / "loop_count"
    return _patch(src, tmp / "badmagic", _fatbin_offset(src), b"\xde\xad\xbe\xef")


def _case_bad_entry_header(samples, tmp):
    src = samples / "loop_count"
    return _patch(src, tmp / "badentry", _fatbin_offset(src) + 16 + 4, struct.pack("<I", 7))  # header size 7


def _case_corrupt_zstd(samples, tmp):
    src = samples / "loop_count"
    (c,) = container.parse_section(hostelf.parse(src.read_bytes()).sections[".nv_fatbin"].data)
    ptx_entry = c.entries[1]
    return _patch(src, tmp / "badzstd", _fatbin_offset(src) + ptx_entry.offset + ptx_entry.header_size + 64, bytes(64))


def _case_corrupt_lz4(samples, tmp):
    src = samples / "loop_count_lz4"
    (c,) = container.parse_section(hostelf.parse(src.read_bytes()).sections[".nv_fatbin"].data)
    e = c.entries[1]
    return _patch(src, tmp / "badlz4", _fatbin_offset(src) + e.offset + e.header_size, b"\xff" * 256)


def _case_corrupt_bitcode(samples, tmp):
    src = samples / "loop_count"
    data = src.read_bytes()
    at = data.index(b"BC\xc0\xde")  # the cubin's copy (stored uncompressed) comes first
    return _patch(src, tmp / "badbitcode", at + 24, b"\xff" * 200)


def _case_sass(samples, tmp):
    return samples / "loop_count_sass"


CASES = {
    "missing file": (_case_missing, 3, "no such file"),
    "directory": (_case_directory, 3, "is a directory"),
    "not an ELF": (_case_not_elf, 4, "not an ELF file"),
    "empty file": (_case_empty, 4, "not an ELF file"),
    "truncated ELF": (_case_truncated_elf, 5, ""),
    "ELF without .nv_fatbin": (_case_no_fatbin, 4, "no .nv_fatbin section"),
    "container size past the section": (_case_fatbin_size_too_big, 5, "truncated"),
    "container magic": (_case_bad_container_magic, 5, "bad magic"),
    "entry header size": (_case_bad_entry_header, 5, "header size 7"),
    "corrupt zstd payload": (_case_corrupt_zstd, 5, "zstd"),
    "corrupt LZ4 payload": (_case_corrupt_lz4, 5, "lz4"),
    "bitcode LLVM cannot parse": (_case_corrupt_bitcode, 7, "cannot parse the embedded bitcode"),
    "SASS-only nvcc binary": (_case_sass, 6, "rebuild keeping PTX"),
}


@pytest.mark.parametrize("command", [["inspect"], ["inspect", "--json"], []], ids=["inspect", "inspect-json", "rewrite"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_one_line_error_and_exit_code(samples, tmp_path, case, command):
    make, code, reason = CASES[case]
    path = make(samples, tmp_path)
    before = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    proc = run_cli(*command, str(path), *(["-o", str(tmp_path / "out")] if not command else []))
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("proteus-rewrite: error: ") and str(path) in lines[0]
    assert reason in lines[0]
    assert proc.stdout == ""
    if before is not None:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_llvm_aborting_on_bitcode_is_a_bitcode_error_not_a_crash(samples, monkeypatch):
    """llvmlite's LLVM keeps its assertions: some malformed bitcode aborts the process
    (fuzzing found one). Bitcode is read in a forked child, so that is an error, not a crash."""
    import os

    from proteus_rewrite.errors import BitcodeError
    from proteus_rewrite.fatbin import bitcode, kernels

    monkeypatch.setattr(bitcode, "analyze", lambda bc: os.abort())
    with pytest.raises(BitcodeError, match="LLVM crashed reading embedded bitcode module 0"):
        kernels.extract(samples / "loop_count")


def test_an_unknown_elf_type_is_shown_without_stray_warnings(samples, tmp_path):
    data = bytearray((samples / "loop_count").read_bytes())
    data[16] = 31  # e_type: no such type
    odd = tmp_path / "odd_type"
    odd.write_bytes(bytes(data))
    r = run_cli("inspect", str(odd))
    assert r.returncode == 0 and "unknown(31)" in r.stdout and r.stderr == "", r.stderr
