"""Launches of the samples' kernels for CPU tests: a kernel by name, and a launch with some
arguments given (the others zero, pointers at fixed fake addresses)."""

from __future__ import annotations

from proteus_rewrite.jit import Launch
from proteus_rewrite.jit.launch import parse_value

PTR_X, PTR_Y = 0x7F0000000000, 0x7F0000400000


def kernel(t, prefix):
    (k,) = [k for k in t.kernels if k.demangled.startswith(prefix) and k.arch == 90]
    return k


def launch_for(k, values: dict[int, str], block=(256, 1, 1), grid=(4096, 1, 1), globals_=None):
    raw = []
    for p in k.params:
        if p.index in values:
            raw.append(parse_value(p, values[p.index]))
        elif p.kind == "pointer":
            raw.append((PTR_X + 0x100000 * p.index).to_bytes(8, "little"))
        else:
            raw.append(bytes(p.size))
    return Launch(tuple(raw), grid, block, 90, globals_ or {})


def runtime_over(store_dir, kernel_name: str):
    """The run time initialized over the store in `store_dir` (PROTEUS_CACHE_DIR and
    PROTEUS_COMPILE_PROCESS set by the caller), with `kernel_name` resolved as kernel 0, as the
    shim's first launch of it would: (state, table, kernel)."""
    from proteus_rewrite import runtime
    from proteus_rewrite.runtime.session import KernelStats

    runtime.reset()
    assert runtime.init(str(store_dir), 13000)
    st = runtime.state()
    t = st.tables[0]
    k = kernel(t, kernel_name)
    st.kernels.append((t, k))
    st.stats.append(KernelStats(k.name, k.demangled))
    return st, t, k
