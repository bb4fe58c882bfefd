"""Fat binary containers and entries: headers, compression, PTX fallback."""

from __future__ import annotations

import pytest

from bench.lib.synthetic import container_bytes, host_elf_with_fatbin, raw_entry
from proteus_rewrite.errors import FormatError
from proteus_rewrite.fatbin import container, cubin, entry, extract, hostelf, ptx


def _section(path):
    return hostelf.parse(path.read_bytes()).sections[".nv_fatbin"].data


@pytest.mark.parametrize(
    "app, cubin_compression, ptx_compression",
    [
        ("loop_count", "none", "zstd"),  # CUDA 13's default: PTX zstd-compressed
        ("loop_count_uncompressed", "none", "none"),
        ("loop_count_lz4", "none", "lz4"),  # compress-mode=speed
        ("loop_count_zstd_all", "zstd", "zstd"),  # compress-mode=size: the cubin too
    ],
)
def test_entries_decode_to_the_same_device_code_whatever_the_compression(samples, app, cubin_compression, ptx_compression):
    (c,) = container.parse_section(_section(samples / app))
    elf, text = c.entries
    assert (elf.kind, elf.arch, elf.compression) == (entry.Kind.ELF, 90, cubin_compression)
    assert (text.kind, text.arch, text.compression) == (entry.Kind.PTX, 90, ptx_compression)
    assert elf.format_version == 0x0101 and elf.header_size == 64 and text.header_size >= 80
    reference = container.parse_section(_section(samples / "loop_count_uncompressed"))[0]
    assert cubin.parse(elf.payload()).kernels == cubin.parse(reference.entries[0].payload()).kernels
    # The PTX differs only in the embedded cc1 command line (it names the output file).
    got, ref = ptx.parse(text.payload()), ptx.parse(reference.entries[1].payload())
    assert got.entries == ref.entries and got.modules[0].bitcode == ref.modules[0].bitcode
    if text.compression != "none":
        assert text.compressed_size <= text.payload_size < text.uncompressed_size
        assert len(text.payload()) <= text.uncompressed_size


def test_compressed_and_uncompressed_builds_record_identical_bitcode(table):
    ref = table("loop_count_uncompressed").modules[0].code
    for app in ("loop_count", "loop_count_lz4", "loop_count_zstd_all"):
        assert table(app).modules[0].code == ref


def test_ptx_only_fatbin_gives_the_same_kernels_from_the_ptx_text(samples, tmp_path, table):
    section = _section(samples / "loop_count")
    (c,) = container.parse_section(section)
    ptx_entry = next(e for e in c.entries if e.kind == entry.Kind.PTX)
    exe = host_elf_with_fatbin(tmp_path, container_bytes([raw_entry(section, ptx_entry)]))
    t = extract(exe)
    ref = table("loop_count")
    assert {k.name: k.params for k in t.kernels} == {k.name: k.params for k in ref.kernels}
    assert all(k.layout_source == "ptx" for k in t.kernels)
    assert t.modules[0].code == ref.modules[0].code


def test_ptx_parser_reads_entries_launch_bounds_and_the_embedded_module(samples):
    (c,) = container.parse_section(_section(samples / "templates"))
    p = ptx.parse(next(e for e in c.entries if e.kind == entry.Kind.PTX).payload())
    b = p.entries["_Z11bounded_sumPKfPfii"]
    assert b.max_threads == (128, 1, 1) and b.min_ctas == 4
    assert [(q.offset, q.size) for q in p.entries["_Z6affine6AffinePKfPf"].params] == [(0, 24), (24, 8), (32, 8)]
    (mod,) = p.modules
    assert mod.bitcode[:4] == b"BC\xc0\xde" and "-fembed-bitcode=all" in mod.cmdline


def test_cubin_parameter_records_match_the_ptx_layout(samples):
    (c,) = container.parse_section(_section(samples / "templates"))
    elf, text = c.entries
    cb, px = cubin.parse(elf.payload()), ptx.parse(text.payload())
    for name, k in cb.kernels.items():
        assert k.params == px.entries[name].params
        assert k.param_size == px.entries[name].param_size


def test_ptx_entry_options_are_decoded():
    import struct

    opts = b"-O2 --verbose\0\0\0"
    payload = b".version 8.5\n.target sm_90\n.address_size 64\n"
    header = struct.pack("<HHIQIIHHIIIQQQ", 1, 0x0101, 64 + 16 + len(opts), len(payload), 0, 64, 5, 8, 90, 0, 0, 0x11, 0, 0)
    header += struct.pack("<II", 80, 13) + bytes(8) + opts
    e = entry.parse(header + payload, 0)
    assert e.options == "-O2 --verbose" and e.version == (8, 5) and e.payload() == payload.rstrip(b"\0")


def test_several_containers_in_one_section_are_all_found(samples):
    cs = container.parse_section(_section(samples / "two_tu"))
    assert len(cs) == 2 and cs[1].offset % 8 == 0 and cs[0].digest != cs[1].digest


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b[:8], "header truncated"),
        (lambda b: b"\x00\x00\x00\x00" + b[4:], "bad magic"),
        (lambda b: b[:8] + (len(b) * 2).to_bytes(8, "little") + b[16:], "truncated"),
    ],
)
def test_container_errors_are_format_errors(samples, mutate, message):
    section = _section(samples / "loop_count")
    with pytest.raises(FormatError, match=message):
        container.parse(mutate(section))


def test_corrupt_zstd_payload_is_a_format_error(samples):
    (c,) = container.parse_section(_section(samples / "loop_count"))
    ptx_entry = c.entries[1]
    stored = bytearray(ptx_entry.stored)
    stored[40:80] = bytes(40)
    bad = entry.Entry(**{**ptx_entry.__dict__, "stored": bytes(stored)})
    with pytest.raises(FormatError, match="zstd"):
        bad.payload()


def test_corrupt_lz4_payload_is_a_format_error(samples):
    (c,) = container.parse_section(_section(samples / "loop_count_lz4"))
    e = c.entries[1]
    bad = entry.Entry(**{**e.__dict__, "stored": bytes([0xFF]) * len(e.stored)})
    with pytest.raises(FormatError, match="lz4"):
        bad.payload()


def test_implausible_uncompressed_size_is_refused_before_inflating(samples):
    (c,) = container.parse_section(_section(samples / "loop_count"))
    e = c.entries[1]
    bad = entry.Entry(**{**e.__dict__, "uncompressed_size": 1 << 40})
    with pytest.raises(FormatError, match="implausible"):
        bad.payload()


def test_a_cubin_section_type_lief_does_not_know_gives_no_stray_warning(samples):
    import struct
    import warnings

    (c,) = container.parse_section(_section(samples / "loop_count"))
    data = bytearray(next(e for e in c.entries if e.kind == 2).payload())  # 2: ELF (a cubin)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(1, shnum):  # a type no ELF defines (a fuzzer found this one), but symbols stay readable
        if struct.unpack_from("<I", data, shoff + i * shentsize + 4)[0] not in (2, 3):  # SYMTAB, STRTAB
            struct.pack_into("<I", data, shoff + i * shentsize + 4, 0x80000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            cubin.parse(bytes(data))
        except FormatError:
            pass
