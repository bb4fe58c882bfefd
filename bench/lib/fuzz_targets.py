"""Fuzz targets for the binary parsers, shared by the bounded CI run (tests/cpu/test_fuzz.py) and
long runs on demand (bench/micro/fuzz.py).

Each target takes bytes, runs one parser, and must either succeed or raise a ProteusError:
anything else is a crash. Inputs are real bytes from the samples, mutated (bit flips,
interesting integers written over headers and size fields, truncation, insertion,
deletion), plus generated structures.
"""

from __future__ import annotations

import hashlib
import json
import struct
from functools import lru_cache
from pathlib import Path

from hypothesis import strategies as st

from bench.lib.paths import SAMPLES_BUILD as SAMPLES
from proteus_rewrite import store
from proteus_rewrite.errors import ProteusError
from proteus_rewrite.fatbin import amdgpu_codeobj, container, cubin, entry, hostelf, kernels, offload_bundle, ptx

INTERESTING = [0, 1, 7, 8, 16, 0x40, 0x50, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               0xBA55ED50, 0x466243B1, 1 << 32, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]


@lru_cache(maxsize=None)
def seeds() -> dict[str, bytes]:
    """Real inputs: a fat binary section, its entries (cubin, zstd PTX, LZ4 PTX), a PTX text,
    a store, and a small host ELF carrying the fat binary."""
    from bench.lib.synthetic import host_elf_with_fatbin

    section = hostelf.parse((SAMPLES / "loop_count").read_bytes()).sections[".nv_fatbin"].data
    (c,) = container.parse_section(section)
    lz4_section = hostelf.parse((SAMPLES / "loop_count_lz4").read_bytes()).sections[".nv_fatbin"].data
    (c4,) = container.parse_section(lz4_section)
    cub = c.entries[0].payload()
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="proteus-fuzz-"))
    small = host_elf_with_fatbin(tmp, section[: c.end], "fuzzapp").read_bytes()
    return {
        "section": section,
        "cubin_entry": section[c.entries[0].offset : c.entries[0].offset + c.entries[0].size],
        "zstd_entry": section[c.entries[1].offset : c.entries[1].offset + c.entries[1].size],
        "lz4_entry": lz4_section[c4.entries[1].offset : c4.entries[1].offset + c4.entries[1].size],
        "cubin": cub,
        "ptx": c.entries[1].payload(),
        "store": store.serialize(kernels.build(small, "fuzzapp")),
        "elf": small,
    }


@st.composite
def mutated(draw, seed: bytes, max_ops: int = 6):
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, max_ops))):
        if not data:
            data += draw(st.binary(min_size=1, max_size=64))
            continue
        # Half the time aim at the first 256 bytes, where headers and size fields live.
        limit = min(len(data), 256) if draw(st.booleans()) else len(data)
        pos = draw(st.integers(0, limit - 1))
        op = draw(st.sampled_from(["flip", "byte", "int32", "int64", "truncate", "insert", "delete"]))
        if op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte":
            data[pos] = draw(st.sampled_from([0, 0xFF, 0x7F, 0x80, 0x01]))
        elif op in ("int32", "int64"):
            size = 4 if op == "int32" else 8
            value = draw(st.sampled_from(INTERESTING)) & ((1 << (8 * size)) - 1)
            data[pos : pos + size] = value.to_bytes(size, "little")
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=32))
        else:
            del data[pos : pos + draw(st.integers(1, 64))]
    return bytes(data)


@st.composite
def generated_container(draw):
    """A container built field by field: plausible and implausible headers, any payload."""
    entries = b""
    for _ in range(draw(st.integers(0, 3))):
        payload = draw(st.binary(max_size=128))
        kind = draw(st.sampled_from([1, 2, 4, 9]))
        flags = draw(st.sampled_from([0x11, 0x2011, 0x8011, 0xA011, 0]))
        hs = draw(st.sampled_from([64, 80, 88, 32, 0xFFFF]))
        header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, hs, len(payload), draw(st.integers(0, 200)),
                             draw(st.sampled_from([0, 64, 72, 0xFFFFFFFF])), 0, 0, 90, 0, 0, flags, 0,
                             draw(st.sampled_from([0, len(payload), 1 << 20, 1 << 40])))
        header += bytes(max(0, min(hs, 96) - 64))
        entries += header + payload
    size = draw(st.sampled_from([len(entries), len(entries) + 8, 0, 1 << 40]))
    return struct.pack("<IHHQ", container.MAGIC, 1, 16, size) + entries


@st.composite
def reserialized_store(draw):
    """A store whose manifest is changed and whose checksum is then made right again: it
    reaches the manifest checks instead of stopping at the checksum."""
    raw = seeds()["store"]
    magic, version, flags, mlen, blen, _ = store.HEADER.unpack_from(raw)
    manifest = json.loads(raw[store.HEADER.size : store.HEADER.size + mlen])
    path = draw(st.sampled_from(["app", "fatbins", "modules", "kernels", "warnings", "modules.0", "kernels.0",
                                 "kernels.0.params", "kernels.0.params.0", "modules.0.offset", "modules.0.size"]))
    node, *rest = path.split(".")
    target = manifest
    for part in [node, *rest][:-1]:
        target = target[int(part)] if isinstance(target, list) else target[part]
    last = [node, *rest][-1]
    value = draw(st.sampled_from([None, 0, -1, 1 << 62, "x", [], {}, [1, 2], {"a": 1}]))
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    body = json.dumps(manifest).encode() + raw[store.HEADER.size + mlen :]
    mlen = len(body) - blen
    return store.HEADER.pack(magic, version, flags, mlen, blen, hashlib.sha256(body).digest()) + body


def _container(data: bytes) -> None:
    for c in container.parse_section(data):
        for e in c.entries:
            e.payload()


def _entry(data: bytes) -> None:
    e = entry.parse(data, 0)
    e.payload()


def _cubin(data: bytes) -> None:
    cubin.parse(data)


def _ptx(data: bytes) -> None:
    ptx.parse(data)


def _store(data: bytes) -> None:
    store.deserialize(data)


def _host_elf(data: bytes) -> None:
    hostelf.parse(data)


def _kernel_table(data: bytes) -> None:
    kernels.build(data, "fuzzed")


HIP_SAMPLES = SAMPLES / "hip"


@lru_cache(maxsize=None)
def hip_seeds() -> dict[str, bytes]:
    """A plain and a CCOB-compressed offload bundle, and a code object's metadata note
    (samples/build_hip.py, built here when missing; an error saying why without ROCm: the
    tests call tests/support/hip_samples.py first, which skips)."""
    from samples import build_hip

    status, why = build_hip.build_for_tests()
    if status != "ok":
        raise RuntimeError(why)
    plain = hostelf.parse((HIP_SAMPLES / "loop_count").read_bytes()).sections[".hip_fatbin"].data
    ccob = hostelf.parse((HIP_SAMPLES / "loop_count_ccob").read_bytes()).sections[".hip_fatbin"].data
    (b,) = offload_bundle.parse_section(ccob)
    import io

    import lief

    co = lief.ELF.parse(io.BytesIO(b.code_objects[0].data))
    note = next(bytes(n.description) for n in co.notes if int(n.original_type) == amdgpu_codeobj.NT_AMDGPU_METADATA)
    return {"bundle": plain[: offload_bundle.parse(plain).stored_size], "ccob": ccob[: b.stored_size], "note": note}


def _offload_bundle(data: bytes) -> None:
    for b in offload_bundle.parse_section(data):
        for e in b.code_objects:
            e.arch, e.triple


def _codeobj_metadata(data: bytes) -> None:
    amdgpu_codeobj.parse_metadata(data)


# name -> (parser, strategy of inputs)
TARGETS = {
    "host_elf": (_host_elf, lambda: mutated(seeds()["elf"])),
    "container": (_container, lambda: st.one_of(mutated(seeds()["section"]), generated_container())),
    "entry_zstd": (_entry, lambda: mutated(seeds()["zstd_entry"])),
    "entry_lz4": (_entry, lambda: mutated(seeds()["lz4_entry"])),
    "entry_cubin": (_entry, lambda: mutated(seeds()["cubin_entry"])),
    "cubin": (_cubin, lambda: mutated(seeds()["cubin"])),
    "ptx": (_ptx, lambda: mutated(seeds()["ptx"])),
    "store": (_store, lambda: st.one_of(mutated(seeds()["store"]), reserialized_store())),
    "kernel_table": (_kernel_table, lambda: mutated(seeds()["elf"])),
    "offload_bundle": (_offload_bundle, lambda: st.one_of(mutated(hip_seeds()["bundle"]), mutated(hip_seeds()["ccob"]))),
    "codeobj_metadata": (_codeobj_metadata, lambda: mutated(hip_seeds()["note"])),
}
HIP_TARGETS = ("offload_bundle", "codeobj_metadata")


def run_one(name: str, data: bytes) -> str:
    """'ok', or 'rejected' (a ProteusError); anything else propagates: a crash."""
    parser, _ = TARGETS[name]
    try:
        parser(data)
    except ProteusError as exc:
        assert str(exc).strip(), f"{name}: a ProteusError without a message"
        assert "\n" not in exc.message, f"{name}: a multi-line error message: {exc.message!r}"
        return "rejected"
    return "ok"
