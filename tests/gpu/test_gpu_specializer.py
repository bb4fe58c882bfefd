"""On the GPU, without the shim: specialized kernels loaded next to the original (AOT)
module compute exactly what the original kernels compute, and share its device variables."""

from __future__ import annotations

import struct

import pytest

from proteus_rewrite.fatbin import container, entry, hostelf
from proteus_rewrite.jit import Config, Launch, specialize

pytestmark = pytest.mark.gpu
np = pytest.importorskip("numpy")


@pytest.fixture(scope="module")
def gpu():
    from ..support.cuda_driver import Context

    return Context()


def aot_cubin(path) -> bytes:
    elf = hostelf.parse(path.read_bytes())
    (c,) = container.parse_section(elf.sections[".nv_fatbin"].data)
    return next(e for e in c.entries if e.kind == entry.Kind.ELF and e.arch == 90).payload()


def test_specialized_axpy_matches_the_original_bit_for_bit(gpu, table, samples):
    t = table("loop_count")
    k = next(k for k in t.kernels if k.name == "_Z9axpy_loopiifPKfPf")
    aot = gpu.load(aot_cubin(samples / "loop_count"))
    n = 1 << 20
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    outs = []
    for use_jit in (False, True):
        dx, dy = gpu.alloc(x), gpu.alloc(y)
        args = [struct.pack("<i", n), struct.pack("<i", 8), struct.pack("<f", 0.5), dx.to_bytes(8, "little"), dy.to_bytes(8, "little")]
        launch = Launch(tuple(args), ((n + 255) // 256, 1, 1), (256, 1, 1), 90)
        if use_jit:
            r = specialize(t, k, launch, Config.from_env({}))
            fn = gpu.function(gpu.load(r.image.data), r.entry)  # the variant's own name
        else:
            fn = gpu.function(aot, k.name)
        gpu.launch(fn, launch.grid, launch.block, args)
        outs.append(gpu.read(dy, y))
    assert outs[0].tobytes() == outs[1].tobytes()


@pytest.mark.parametrize("compiler", ["nvjitlink", "ptxas", "driver"])
def test_every_ptx_compiler_loads_and_runs(gpu, table, samples, compiler):
    t = table("loop_count")
    k = next(k for k in t.kernels if k.name == "_Z10mix_roundsyjxPy")
    n = 4096
    v = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    results = []
    for jit in (False, True):
        dv = gpu.alloc(v)
        args = [struct.pack("<Q", n), struct.pack("<I", 5), struct.pack("<q", -42), dv.to_bytes(8, "little")]
        launch = Launch(tuple(args), (n // 256, 1, 1), (256, 1, 1), 90)
        if jit:
            r = specialize(t, k, launch, Config.from_env({"PROTEUS_PTX_COMPILER": compiler}))
            fn = gpu.function(gpu.load(r.image.data), r.entry)
        else:
            fn = gpu.function(gpu.load(aot_cubin(samples / "loop_count")), k.name)
        gpu.launch(fn, launch.grid, launch.block, args)
        results.append(gpu.read(dv, v))
    assert results[0].tobytes() == results[1].tobytes()


def test_jit_and_aot_kernels_share_device_variables(gpu, table, samples):
    t = table("device_globals")
    acc = next(k for k in t.kernels if k.name == "_Z10accumulatePKfi")
    n = 1 << 16
    inp = np.random.default_rng(2).standard_normal(n, dtype=np.float32)
    coeffs = np.array([0.5, -1.25, 2.0, 3.0], dtype=np.float32)
    results = []
    for jit in (False, True):
        aot = gpu.load(aot_cubin(samples / "device_globals"))
        addr = {g: gpu.global_address(aot, g) for g in ("hits", "table", "coeffs")}
        gpu.write(addr["coeffs"], coeffs)
        gpu.write(addr["hits"], np.zeros(1, dtype=np.uint32))
        din = gpu.alloc(inp)
        dout = gpu.alloc(np.zeros(n, dtype=np.float32))
        args = [din.to_bytes(8, "little"), struct.pack("<i", n)]
        launch = Launch(tuple(args), (n // 256, 1, 1), (256, 1, 1), 90, addr)
        if jit:
            r = specialize(t, acc, launch, Config.from_env({}))
            fn = gpu.function(gpu.load(r.image.data), r.entry)
        else:
            fn = gpu.function(aot, acc.name)
        gpu.launch(fn, launch.grid, launch.block, args)  # JIT writes the AOT module's hits and table...
        apply = gpu.function(aot, "_Z5applyPfPKfi")  # ...which the AOT kernel then reads
        gpu.launch(apply, launch.grid, launch.block, [dout.to_bytes(8, "little"), din.to_bytes(8, "little"), struct.pack("<i", n)])
        hits = gpu.read(addr["hits"], np.zeros(1, dtype=np.uint32))
        results.append((int(hits[0]), gpu.read(dout, inp).tobytes()))
    assert results[0][0] == int((inp > 0).sum())
    assert results[0] == results[1]
