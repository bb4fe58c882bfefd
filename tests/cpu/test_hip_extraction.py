"""HIP executables: .hip_fatbin -> offload bundles (plain and CCOB) -> AMDGPU code objects ->
the same kernel table and store as CUDA apps, with the processor as the arch."""

from __future__ import annotations

import struct
import zlib

import pytest
import zstandard

from proteus_rewrite import store
from proteus_rewrite.errors import FormatError
from proteus_rewrite.fatbin import amdgpu_codeobj, extract, hostelf, offload_bundle

from ..conftest import run_cli
from ..support.hip_samples import hip_samples


@pytest.fixture(scope="module")
def hip():
    root = hip_samples()
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = extract(root / name)
        return cache[name]

    get.root = root
    return get


def _section(root, name):
    return hostelf.parse((root / name).read_bytes()).sections[".hip_fatbin"].data


def test_hip_kernels_are_recorded_per_processor_with_codeobj_layout(hip):
    t = hip("loop_count")
    assert t.app.platform == "hip"
    assert {k.arch for k in t.kernels} == {"gfx90a", "gfx940"}
    axpy = next(k for k in t.kernels if k.name == "_Z9axpy_loopiifPKfPf" and k.arch == "gfx90a")
    assert axpy.layout_source == "codeobj"
    assert [(p.offset, p.size, p.llvm_type) for p in axpy.params] == [
        (0, 4, "i32"), (4, 4, "i32"), (8, 4, "float"), (16, 8, "ptr addrspace(1)"), (24, 8, "ptr addrspace(1)")]
    assert axpy.param_size == 32  # explicit arguments only: the runtime fills the hidden ones
    assert t.modules[axpy.module].arch == "gfx90a"
    assert t.modules[axpy.module].triple == "amdgcn-amd-amdhsa"
    assert t.kernels_with_bitcode == list(t.kernels)
    assert not t.warnings


def test_compressed_bundle_yields_the_same_kernels_as_the_plain_one(hip):
    plain, ccob = hip("loop_count"), hip("loop_count_ccob")
    assert {e.compression for e in ccob.fatbins[0].entries} == {"zstd"}
    assert ccob.fatbins[0].size < plain.fatbins[0].size
    assert [(m.arch, m.source_filename) for m in ccob.modules] == [(m.arch, m.source_filename) for m in plain.modules]
    assert [(k.name, k.arch, k.params) for k in ccob.kernels] == [(k.name, k.arch, k.params) for k in plain.kernels]


def test_code_object_v4_metadata_gives_the_same_explicit_layout(hip):
    v4, v5 = hip("loop_count_cov4"), hip("loop_count")
    assert [(k.name, k.params, k.param_size) for k in v4.kernels] == [(k.name, k.params, k.param_size) for k in v5.kernels]


def test_two_translation_units_are_two_bundles(hip):
    t = hip("two_tu")
    assert len(t.fatbins) == 2
    assert t.fatbins[1].offset % 4096 == 0
    by_bundle = {f.index: sorted({k.demangled.split("(")[0] for k in t.kernels if k.fatbin == f.index}) for f in t.fatbins}
    assert by_bundle == {0: ["square"], 1: ["histogram", "normalize"]}


def test_launch_bounds_struct_arguments_and_device_variables(hip):
    t = hip("templates")
    bounded = next(k for k in t.kernels if k.name == "_Z11bounded_sumPKfPfii")
    assert bounded.max_threads == (128, 1, 1)
    assert all(k.max_threads is None for k in t.kernels if k.name != bounded.name)  # HIP's default 1024 is no bound
    affine = next(k for k in t.kernels if k.name == "_Z6affine6AffinePKfPf")
    assert (affine.params[0].kind, affine.params[0].size, affine.params[0].byval) == ("aggregate", 24, True)
    assert not t.warnings
    g = hip("device_globals")
    assert {k.globals for k in g.kernels} == {("coeffs", "hits", "table")}


def test_driver_built_code_objects_are_recorded_with_a_warning(hip):
    t = hip("loop_count_driver")
    assert {k.arch for k in t.kernels} == {"gfx90a", "gfx940"}  # from the bundle ids
    assert len(t.warnings) == 2 and all("names no processor" in w for w in t.warnings)


def test_hip_store_round_trips(hip, tmp_path):
    t = hip("templates")
    back = store.read(store.write(t, tmp_path / "templates.kstore"))
    assert back.kernels == t.kernels and back.app == t.app and back.fatbins == t.fatbins
    assert [m.code for m in back.modules] == [m.code for m in t.modules]


def test_inspect_json_lists_hip_kernels(hip):
    import json

    proc = run_cli("inspect", str(hip.root / "loop_count"), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["app"]["platform"] == "hip"
    assert {k["arch"] for k in doc["kernels"]} == {"gfx90a", "gfx940"}


def test_code_object_reports_target_features_and_descriptors(hip):
    (b,) = offload_bundle.parse_section(_section(hip.root, "loop_count"))
    co = amdgpu_codeobj.parse(b.code_objects[0].data)
    assert (co.arch, co.abi_version, co.metadata.version) == ("gfx90a", 3, (1, 2))
    assert "_Z9axpy_loopiifPKfPf.kd" in co.descriptors
    assert co.cmdline[:3] == ("-cc1", "-triple", "amdgcn-amd-amdhsa")
    assert co.bitcode[:4] == b"BC\xc0\xde"


def _bundle(entries: list[tuple[str, bytes]]) -> bytes:
    header = struct.pack("<24sQ", offload_bundle.MAGIC, len(entries))
    table_size = sum(24 + len(i) for i, _ in entries)
    pos, table, body = len(header) + table_size, b"", b""
    for ident, data in entries:
        table += struct.pack("<QQQ", pos + len(body), len(data), len(ident)) + ident.encode()
        body += data
    return header + table + body


def _ccob(raw: bytes, version: int, method: int) -> bytes:
    data = zstandard.ZstdCompressor().compress(raw) if method == 1 else zlib.compress(raw)
    if version == 1:
        return struct.pack("<4sHHIQ", b"CCOB", 1, method, len(raw), 7) + data
    if version == 2:
        return struct.pack("<4sHHIIQ", b"CCOB", 2, method, 24 + len(data), len(raw), 7) + data
    return struct.pack("<4sHHQQQ", b"CCOB", 3, method, 32 + len(data), len(raw), 7) + data


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("method", [0, 1])
def test_every_ccob_version_and_method_is_read(version, method):
    raw = _bundle([("host-x86_64-unknown-linux--", b""), ("hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", b"\x7fELF" * 9)])
    packed = _ccob(raw, version, method)
    section = packed + bytes((-len(packed)) % 4096) + raw  # a second, plain bundle after the padding
    first, second = offload_bundle.parse_section(section)
    assert (first.compression, first.ccob_version, first.stored_size) == (("zlib", "zstd")[method], version, len(packed))
    e = first.entries[1]
    assert (e.kind, e.triple, e.target_id, e.arch, e.data) == ("hipv4", "amdgcn-amd-amdhsa", "gfx942:sramecc+:xnack-", "gfx942",
                                                               b"\x7fELF" * 9)
    assert second.offset % 4096 == 0 and second.compression == "none" and second.entries == first.entries


@pytest.mark.parametrize("mangle, reason", [
    (lambda b: b[:100], "truncated"),
    (lambda b: b[:24] + struct.pack("<Q", 1 << 40) + b[32:], "do not fit"),
    (lambda b: b"CCOB\x09\x00" + b[6:], "CCOB version 9"),
    (lambda b: b"XXXX" + b[4:], "no __CLANG_OFFLOAD_BUNDLE__"),
])
def test_corrupt_bundles_are_one_line_format_errors(mangle, reason):
    raw = _bundle([("hipv4-amdgcn-amd-amdhsa--gfx90a", b"x" * 64)])
    with pytest.raises(FormatError, match=reason) as exc:
        offload_bundle.parse_section(mangle(raw))
    assert "\n" not in str(exc.value)


def test_ccob_that_inflates_past_its_declared_size_is_refused():
    raw = _bundle([("hipv4-amdgcn-amd-amdhsa--gfx90a", bytes(100_000))])
    data = zstandard.ZstdCompressor().compress(raw)
    lying = struct.pack("<4sHHIIQ", b"CCOB", 2, 1, 24 + len(data), 1000, 0) + data
    with pytest.raises(FormatError, match="inflates past"):
        offload_bundle.parse(lying)


def test_metadata_note_with_wrong_types_is_a_format_error():
    import msgpack

    good = {"amdhsa.version": [1, 2], "amdhsa.target": "amdgcn-amd-amdhsa--gfx90a",
            "amdhsa.kernels": [{".name": "k", ".symbol": "k.kd", ".kernarg_segment_size": 8,
                                ".args": [{".offset": 0, ".size": 4, ".value_kind": "by_value"},
                                          {".offset": 8, ".size": 4, ".value_kind": "hidden_block_count_x"}]}]}
    meta = amdgpu_codeobj.parse_metadata(msgpack.packb(good))
    assert [a.value_kind for a in meta.kernels[0].params] == ["by_value"]
    bad = dict(good, **{"amdhsa.kernels": [{".name": 5}]})
    with pytest.raises(FormatError, match="is not a string"):
        amdgpu_codeobj.parse_metadata(msgpack.packb(bad))
    with pytest.raises(FormatError, match="truncated"):
        amdgpu_codeobj.parse_metadata(msgpack.packb(good)[:-3])
