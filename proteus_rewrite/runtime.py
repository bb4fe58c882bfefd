"""The Python half of libproteus.so, called from C on a miss (never on a cache hit).

    init(shim_dir, driver_version)            once, when the first kernel is launched
    kernel_info(image_ptr, name, arch)        which recorded kernel a launch handle is
    specialize(kid, args, grid, block, globals, arch, gpu_ms) -> cubin/PTX bytes (HIP: a code object), or None
                                              to run the original
    track(kid, args, grid, block, earlier)    a launch the shim's table missed: the value tracker's policy
    miss(kid, args, grid, block, globals, arch, gpu_ms, cached_only, earlier)  track, then (unless the
                                              policy changed) specialize, in one call
    track_deferred(kid, earlier)              launches the shim deferred: on a compile thread before
                                              it takes a job, and at exit
    load_failed(kid, error)                   the driver (HIP: the runtime) refused our image
    prepare_compiler(arch, ahead) -> bool     the compiler's first use, ahead of the first specialization
    finish()                                  at exit: notes whether this run compiled (the next run's guess)
    write_report(path, counters, unknown, waits)  at exit, for PROTEUS_REPORT

Kernel stores (*.kstore) are found beside the shim (or in PROTEUS_STORE_DIR). A loaded
image is matched to a recorded fat binary by the SHA-256 of its bytes, so a store that
does not belong to the running binary (say, the app was rebuilt) matches nothing and the
app simply runs its original kernels. `arch` is an SM version (CUDA, 90) or the device's
processor (HIP: its gcnArchName, "gfx90a:sramecc+:xnack-"; the features are dropped). Every failure here becomes one warning per kernel
and a None, never an exception into C.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, faults, store
from .policy import (BLOCK, GRID, POLICY_KIND, RUN_KIND, Budget, Tracker, compiles_likely, decode_learned, decode_run,
                     encode_learned, encode_run, policy_key, run_key)
from .cache import CacheChain, Entry, StorageCache, make_chain
from .errors import ProteusError
from .fatbin.table import KernelRecord, KernelTable, best_for_arch
from .jit import process
from .jit import specializer as spec_mod
from .jit.config import Config
from .jit.launch import Launch, foldable

log = logging.getLogger("proteus_rewrite")

WRAPPER_MAGIC = 0x466243B1
FATBIN_MAGIC = 0xBA55ED50
HIP_WRAPPER_MAGIC = 0x48495046  # clang's __hip_fatbin_wrapper ("HIPF"), what __hipRegisterFatBinary takes


@dataclass
class KernelStats:
    name: str
    demangled: str
    specializations: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    compile_ms: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)
    variants: list[dict] = field(default_factory=list)
    tracker: Tracker | None = None
    budget_refusals: int = 0
    gpu_ms: float = 0.0  # the shim's latest estimate
    policy_key: str = ""  # where the tracker's decisions are saved (policy.policy_key)
    policy_unsaved: bool = False  # the tracker stopped folding something since it was last saved
    # variants queued for a compile thread and not compiled yet, by their cache key: the report
    # lists the launches of what is left at exit, so that prewarm compiles those too
    queued: dict[str, dict] = field(default_factory=dict)


@dataclass
class State:
    shim_dir: str
    driver_version: int
    config: Config
    cache: CacheChain
    tables: list[KernelTable]
    by_fatbin: dict[str, tuple[KernelTable, int]]  # container sha256 -> (table, fatbin index)
    by_entry: dict[str, tuple[KernelTable, int]]  # cubin sha256 -> (table, fatbin index)
    images: dict[int, tuple[KernelTable, int] | None] = field(default_factory=dict)
    kernels: list[tuple[KernelTable, KernelRecord]] = field(default_factory=list)
    stats: list[KernelStats] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.time)
    # variants the app's last run compiled (its note in the disk cache), once read; None: unknown
    last_run: int | None = None
    last_run_read: bool = False
    warm_up_skipped: bool = False  # the prestart thread left the compiler cold: see policy.compiles_likely
    compiler: process.Compilers | None = None  # None: compile in this process (PROTEUS_COMPILE_PROCESS=0)


_state: State | None = None  # module-level on purpose: one per process, like the shim's tables


def _warn_once(what: str, message: str) -> None:
    assert _state is not None
    if what not in _state.warned:
        _state.warned.add(what)
        print(f"proteus: warning: {message}", file=sys.stderr, flush=True)


def _trace(token: str, message: str) -> None:
    if _state is not None and token in _state.config.trace:
        print(f"proteus: {message}", file=sys.stderr, flush=True)


_profile = None  # PROTEUS_PROFILE: cProfile of every call into this module, written at exit


def init(shim_dir: str, driver_version: int) -> bool:
    global _state, _profile
    if os.environ.get("PROTEUS_PROFILE"):
        import cProfile

        _profile = cProfile.Profile()
        _profile.enable()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("proteus: warning: %(message)s"))  # the shim only logs warnings
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False
    try:
        config = Config.from_env()
    except ProteusError as exc:  # a bad PROTEUS_* value: one line, and the app runs as built
        print(f"proteus: error: {exc}; kernels run unspecialized", file=sys.stderr)
        return False
    store_dir = Path(os.environ.get("PROTEUS_STORE_DIR") or shim_dir)
    tables, by_fatbin, by_entry = [], {}, {}
    for path in sorted(store_dir.glob(f"*{store.SUFFIX}")):
        try:
            table = store.read(path)
        except ProteusError as exc:
            print(f"proteus: warning: {exc}; ignoring it", file=sys.stderr)
            continue
        tables.append(table)
        for f in table.fatbins:
            by_fatbin[f.sha256] = (table, f.index)
            for e in f.entries:
                if e.sha256:
                    by_entry[e.sha256] = (table, f.index)
    if not tables:
        print(f"proteus: warning: no kernel store (*.kstore) in {store_dir}; kernels run unspecialized", file=sys.stderr)
    _state = State(shim_dir, driver_version, config, make_chain(config.use_stored_cache, config.cache_dir, config.cache_max_mb),
                   tables, by_fatbin, by_entry)
    if config.compile_process:
        python = process.python_executable(_recorded_python(shim_dir))
        if python:
            _state.compiler = process.Compilers(python, config.async_threads, quiet="specialization" not in config.trace)
        else:
            _trace("specialization", "no Python executable to run the compiler in: compiling in the app's process")
    return True


def _recorded_python(shim_dir: str) -> str | None:
    """The `executable` line of the shim's proteus-python.cfg (older ones have none)."""
    try:
        with open(os.path.join(shim_dir, "proteus-python.cfg")) as f:
            return next((line[len("executable "):].rstrip("\n") for line in f if line.startswith("executable ")), None)
    except OSError:
        return None


def _image(ptr: int) -> tuple[KernelTable, int] | None:
    """Which recorded fat binary the image at `ptr` (a fatbin wrapper, container or cubin; HIP: a
    wrapper, an offload bundle, plain or CCOB, or a code object) is."""
    assert _state is not None
    if ptr in _state.images:
        return _state.images[ptr]
    found = None
    magic = struct.unpack("<I", ctypes.string_at(ptr, 4))[0]
    if magic in (WRAPPER_MAGIC, HIP_WRAPPER_MAGIC):
        ptr = struct.unpack("<Q", ctypes.string_at(ptr + 8, 8))[0]
        magic = struct.unpack("<I", ctypes.string_at(ptr, 4))[0]
    if ctypes.string_at(ptr, 4) in (b"__CL", b"CCOB"):  # __CLANG_OFFLOAD_BUNDLE__: HIP, one per translation unit
        from .fatbin import offload_bundle

        size = offload_bundle.stored_size(lambda off, n: ctypes.string_at(ptr + off, n))
        found = _state.by_fatbin.get(hashlib.sha256(ctypes.string_at(ptr, size)).hexdigest())
    elif magic == FATBIN_MAGIC:
        header_size, size = struct.unpack("<HQ", ctypes.string_at(ptr + 6, 10))
        found = _state.by_fatbin.get(hashlib.sha256(ctypes.string_at(ptr, header_size + size)).hexdigest())
    elif ctypes.string_at(ptr, 4) == b"\x7fELF":
        from .fatbin.cubin import image_size

        size = image_size(ctypes.string_at(ptr, 64))
        found = _state.by_entry.get(hashlib.sha256(ctypes.string_at(ptr, size)).hexdigest())
    _state.images[ptr] = found
    return found


def kernel_info(image_ptr: int, name: str, arch: int | str) -> bytes | None:
    """The C side's view of a kernel: u32 kid, nparams, dims flags, nglobals, defer (how many
    launches the shim may hand to the value tracker later: DEFERRED); u32 sizes[]; u8 fold[];
    NUL-terminated global names. None: run this kernel's original code, always."""
    try:
        return _kernel_info(image_ptr, name, arch)
    except Exception as exc:  # never let an exception reach the C caller
        _warn_once(name, f"{name}: {type(exc).__name__}: {exc}; running the original kernel")
        return None


def _kernel_info(image_ptr: int, name: str, arch: int | str) -> bytes | None:
    assert _state is not None
    if _state.config.disable:
        return None
    match = _image(image_ptr) if image_ptr else None
    if match is None:
        if _state.tables:  # (with no store at all, init has already said so)
            _warn_once(f"image:{image_ptr}", f"the fat binary of {name} is not in any kernel store (app rebuilt since "
                                             "proteus-rewrite?); its kernels run unspecialized")
        return None
    table, fatbin = match
    candidates = [k for k in table.kernels if k.fatbin == fatbin and k.name == name]
    record = best_for_arch(candidates, arch)
    if record is None:
        what = ("is not recorded" if not candidates else "has no embedded bitcode" if not any(k.has_bitcode for k in candidates)
                else f"has no bitcode for {arch} (built for {', '.join(sorted({str(k.arch) for k in candidates}))})")
        _warn_once(name, f"{name} {what}; running the original kernel")
        return None
    cg = _state.config.for_kernel(record.name, record.demangled)
    allowed = set(record.jit_args) if record.jit_args is not None else None
    fold = bytes(
        1 if (cg.specialize_args and foldable(p) and (allowed is None or p.index + 1 in allowed))
        or (cg.specialize_alignment and p.kind == "pointer") else 0
        for p in record.params
    )
    dims = (1 if (cg.specialize_launch_bounds or cg.specialize_dims or cg.specialize_dims_range) else 0) | (
        2 if (cg.specialize_dims or cg.specialize_dims_range) else 0)
    if isinstance(record.arch, str):  # AMDGPU: only the block reaches the code, as the flat work-group size
        dims = 1 if cg.specialize_launch_bounds else 0
    kid = len(_state.kernels)
    _state.kernels.append((table, record))
    stats = KernelStats(record.name, record.demangled)
    config = _state.config
    if config.tracker:
        fixed = frozenset(i - 1 for i in record.jit_args) if record.jit_args is not None else frozenset()
        stats.tracker = Tracker(config.tracker_threshold, config.tracker_ratio, {i for i, f in enumerate(fold) if f}, dims, fixed)
        stats.policy_key = _policy_key(table, record)
        saved = _state.cache.get(stats.policy_key)
        if saved is not None and saved[0].kind == POLICY_KIND:
            stats.tracker.start_from(decode_learned(saved[0].data))
            fold = bytes(1 if i in stats.tracker.folded else 0 for i in range(len(record.params)))
            dims = stats.tracker.dims
    _state.stats.append(stats)
    sizes = struct.pack(f"<{len(record.params)}I", *(p.size for p in record.params))
    names = b"".join(g.encode() + b"\0" for g in record.globals)
    # T + 2: enough for a step counter's learning to pass without a Python call on the launching thread
    defer = min(config.tracker_threshold + 2, MAX_DEFERRED) if stats.tracker is not None else 0
    return struct.pack("<5I", kid, len(record.params), dims, len(record.globals), defer) + sizes + fold + names


def _policy_key(table: KernelTable, record: KernelRecord) -> str:
    assert _state is not None
    fatbin = next((f for f in table.fatbins if f.index == record.fatbin), None)
    if fatbin is None:
        return ""
    return policy_key(fatbin.sha256, record.name, record.arch, _state.config.tracker_threshold, _state.config.tracker_ratio)


def track(kid: int, args: bytes, grid: tuple, block: tuple, earlier: bytes = b"") -> bytes:
    """A launch whose key the shim's table lacks. Returns the kernel's policy, which the shim's
    key follows from now on: u32 dims (bit 0 block, bit 1 grid); u8 fold[nparams]. `earlier`:
    launches of the kernel the shim deferred (DEFERRED), seen first, in order."""
    return _track(kid, (args, grid, block), earlier)[0]


def track_deferred(kid: int, earlier: bytes) -> bytes:
    """Launches the shim deferred (their variants queued unasked), from a compile thread before
    it takes a job, which a policy they change makes stale, and at exit. Returns the policy."""
    return _track(kid, None, earlier)[0]


# A launch the shim handed to the tracker later rather than call Python on the launching thread
# (a new key while a variant of its kernel is queued: see defer() in the shim): u32 grid[3],
# u32 block[3], then the arguments' bytes as specialize takes them.
DEFERRED = struct.Struct("<6I")
MAX_DEFERRED = 64  # kept per kernel at most, whatever T: the shim holds them until a drain


def _track(kid: int, launch: tuple[bytes, tuple, tuple] | None, earlier: bytes = b"") -> tuple[bytes, bool]:
    """The policy (as track), and whether these launches changed it: the deferred ones in
    `earlier`, then `launch` (args, grid, block; None: none)."""
    assert _state is not None
    record, stats = _state.kernels[kid][1], _state.stats[kid]
    tracker = stats.tracker
    if tracker is None:
        return b"", False  # no tracker: the policy never changes (the shim ignores an empty answer)
    before = len(tracker.dropped)
    try:
        offsets, off = [], 0
        for p in record.params:
            offsets.append(off)
            off += p.size

        def see(args: bytes, grid: tuple, block: tuple) -> None:
            tracker.before({**{i: args[offsets[i] : offsets[i] + record.params[i].size] for i in tracker.folded},
                            BLOCK: struct.pack("<3I", *block), GRID: struct.pack("<3I", *grid)})

        step = DEFERRED.size + off
        for at in range(0, len(earlier) - step + 1, step):
            dims = DEFERRED.unpack_from(earlier, at)
            see(earlier[at + DEFERRED.size : at + step], dims[:3], dims[3:])
        if launch is not None:
            see(*launch)
    except Exception as exc:  # never into C; the policy simply stays as it was
        _warn_once(f"track:{record.name}", f"{record.demangled}: value tracker: {type(exc).__name__}: {exc}")
    changed = len(tracker.dropped) != before
    if changed and stats.policy_key:  # the next run starts from here: saved off this thread (_save_policies)
        stats.policy_unsaved = True
    policy = struct.pack("<I", tracker.dims) + bytes(1 if i in tracker.folded else 0 for i in range(len(record.params)))
    return policy, changed


def _save_policies() -> None:
    """Write the tracker decisions not saved yet to the disk cache. Not on a launching thread
    where that can be helped: a put is a dozen system calls, each a chance for another thread to
    take the GIL, which the launch then waits for. A compile thread does it before compiling,
    and finish() at exit."""
    assert _state is not None
    for (_, record), stats in zip(_state.kernels, _state.stats):
        if stats.policy_unsaved and stats.tracker is not None:
            stats.policy_unsaved = False
            _state.cache.put(Entry(stats.policy_key, POLICY_KIND, record.arch, encode_learned(stats.tracker.dropped),
                                   {"kernel": record.demangled}), enforce_cap=False)


MAX_QUEUED_RECORDS = 256  # per kernel; a value that changes on every launch stops being folded long before

# miss()'s answer: u8 status, u32 nanoseconds in the tracker, u32 policy length; the policy; the image
MISS_HEADER = struct.Struct("<BII")
MISS_POLICY_CHANGED, MISS_IMAGE, MISS_ORIGINAL = 0, 1, 2


def miss(kid: int, args: bytes, grid: tuple, block: tuple, globals_: bytes, arch: int, gpu_ms: float = 0.0,
         cached_only: int = 0, earlier: bytes = b"") -> bytes:
    """A launch whose key the shim's table lacks, in one call: one wait for the GIL on the
    launching thread where track and specialize took two (at a cold start, while the prestart
    or a compile thread runs Python, each such wait was up to the switch interval or longer).
    The tracker sees the launch, after the ones the shim deferred (`earlier`, as track); if that
    changed the kernel's policy, the launch's key is stale
    and nothing more is done (MISS_POLICY_CHANGED: the shim builds the key anew and calls
    specialize); otherwise specialize answers (MISS_IMAGE, with the image, empty when it needs
    compiling; MISS_ORIGINAL for None). Layout: MISS_HEADER, the policy (as track), the image."""
    t0 = time.perf_counter_ns()
    policy, changed = _track(kid, (args, grid, block), earlier)
    tracked = min(time.perf_counter_ns() - t0, 0xFFFFFFFF)
    if changed:
        return MISS_HEADER.pack(MISS_POLICY_CHANGED, tracked, len(policy)) + policy
    image = specialize(kid, args, grid, block, globals_, arch, gpu_ms, cached_only)
    if image is None:
        return MISS_HEADER.pack(MISS_ORIGINAL, tracked, len(policy)) + policy
    return MISS_HEADER.pack(MISS_IMAGE, tracked, len(policy)) + policy + image


def _launch_record(raw, folded, unknown_dims, arch, block, grid, globals_, addrs) -> dict:
    """A launch as the report records it, enough to compile its variant again offline (prewarm)."""
    return {"args": {str(i): raw[i].hex() for i in sorted(folded)}, "unknown_dims": sorted(unknown_dims), "arch": arch,
            "block": list(block), "grid": list(grid), "globals": {g: a for g, a in zip(globals_, addrs)}}


def specialize(kid: int, args: bytes, grid: tuple, block: tuple, globals_: bytes, arch: int | str,
               gpu_ms: float = 0.0, cached_only: int = 0) -> bytes | None:
    """The variant's image, or None to run the original. With cached_only, only the caches are
    asked, and b"" means the variant needs compiling (the shim then queues it)."""
    assert _state is not None
    if isinstance(arch, str):  # HIP's gcnArchName: gfx90a:sramecc+:xnack- -> gfx90a
        arch = arch.split(":", 1)[0]
    table, record = _state.kernels[kid]
    stats = _state.stats[kid]
    stats.gpu_ms = gpu_ms
    try:
        if not cached_only:
            _save_policies()
            if _state.compiler is not None:  # before the tracker's policy is read: see Compilers.ready
                _state.compiler.ready()
        raw, off = [], 0
        for p in record.params:
            raw.append(args[off : off + p.size])
            off += p.size
        addrs = struct.unpack(f"<{len(record.globals)}Q", globals_) if record.globals else ()
        missing = [g for g, a in zip(record.globals, addrs) if not a]
        if missing:
            raise ProteusError(f"the AOT address of {', '.join(missing)} is unknown")
        unknown, unknown_dims = frozenset(), frozenset()
        tracker = stats.tracker
        if tracker is not None:  # its latest policy: at least as general as the key this launch came with
            unknown = frozenset(i for i in range(len(raw)) if i not in tracker.folded)
            unknown_dims = frozenset(d for d, bit in ((BLOCK, 1), (GRID, 2)) if not tracker.dims & bit)
        launch = Launch(tuple(raw), tuple(grid), tuple(block), arch, dict(zip(record.globals, addrs)), unknown, unknown_dims)
        keep_ir = "ir-dump" in _state.config.trace or _state.config.dump_ir
        config = _state.config
        may_compile = not config.compile_budget or Budget(config.compile_budget, config.compile_grace_ms).allows(stats.compile_ms, gpu_ms)
        if isinstance(arch, str) and arch != record.arch:  # HIP: a module built for one processor runs on no other
            raise ProteusError(f"its bitcode was recorded for {record.arch}, this device is a {arch}")
        faults.check("specialize")
        result = spec_mod.specialize(table, record, launch, _state.config, _state.cache, keep_ir=keep_ir,
                                     driver_version=_state.driver_version or None,
                                     may_compile=may_compile and not cached_only, compiler=_state.compiler)
    except spec_mod.CompileBudgetSpent as exc:
        if cached_only and may_compile:  # not in a cache: the shim queues it for a compile thread
            if len(stats.queued) < MAX_QUEUED_RECORDS and exc.key not in stats.queued:
                stats.queued[exc.key] = _launch_record(raw, exc.folded, unknown_dims, arch, block, grid, record.globals, addrs)
            return b""
        stats.budget_refusals += 1  # policy, not a failure: no warning
        _trace("specialization", f"{record.demangled}: compile budget spent ({stats.compile_ms:.0f} ms compiling, "
               f"{gpu_ms:.0f} ms on the GPU); running the original kernel")
        return None
    except Exception as exc:
        reason = str(exc) if isinstance(exc, ProteusError) else f"{type(exc).__name__}: {exc}"
        stats.failures[reason] = stats.failures.get(reason, 0) + 1
        _warn_once(f"spec:{record.name}", f"{record.demangled}: not specialized ({reason}); running the original kernel")
        return None
    stats.queued.pop(result.key, None)
    if result.source == "compiled":
        stats.specializations += 1
        stats.compile_ms += result.timings_ms.get("total", 0.0)
    elif result.source == "disk":
        stats.disk_hits += 1
    else:
        stats.memory_hits += 1
    stats.variants.append({"key": result.key[:16], "source": result.source,
                           "folded": {str(i): v for i, v in result.folded.items()},
                           "block": list(block), "grid": list(grid), "ms": round(result.timings_ms.get("total", 0.0), 2),
                           "timings_ms": {k: round(v, 2) for k, v in result.timings_ms.items()},
                           # enough to compile this variant again offline (proteus-rewrite prewarm)
                           "launch": _launch_record(raw, tuple(result.folded), unknown_dims, arch, block, grid,
                                                    record.globals, addrs)})
    _trace("specialization", f"{record.demangled}: variant {result.key[:12]} ({result.source}) folded "
           f"{ {i: v for i, v in result.folded.items()} } block {tuple(block)} grid {tuple(grid)} "
           f"{result.timings_ms.get('total', 0.0):.1f} ms")
    if result.ir_text is not None:
        _trace("ir-dump", f"IR of {record.demangled} variant {result.key[:12]}:\n{result.ir_text}")
        if _state.config.dump_ir:
            os.makedirs(".proteus-dump", exist_ok=True)
            Path(f".proteus-dump/device-jit-{result.key}.ll").write_text(result.ir_text)
    return result.image.data


WARM_UP_ARCH = 75  # the oldest architecture CUDA 13 compiles for: any will do to warm the compiler up


def prepare_compiler(arch: int, ahead: int = 0) -> bool:
    """The compiler's first use, ahead of any specialization (specializer.warm_up): loading
    LLVM and nvJitLink and one small compilation. The shim calls it on its prestart thread while
    the app creates its CUDA context (arch 0: none known yet; ahead), or else before it starts
    compile threads, so that LLVM's and nvJitLink's exit-time destructors are registered before
    the shim's exit hook that waits for those threads. Ahead, it may decline (False: not done)
    when the app's last run compiled nothing; a compile thread then does it before its first
    job. Not with PROTEUS_ASYNC_COMPILATION=0, where the app's own thread would."""
    assert _state is not None
    if ahead and _state.config.async_compilation != "0" and not compiles_likely(_last_run()):
        _state.warm_up_skipped = True
        _trace("specialization", "the app's last run compiled nothing: the compiler is not warmed up ahead")
        try:
            spec_mod.prepare_keys(_state.config, _state.driver_version or None)
        except Exception as exc:  # the first launch meets it again, and reports it per kernel
            _trace("specialization", f"preparing cache keys: {type(exc).__name__}: {exc}")
        return False
    try:
        if _state.compiler is not None:  # it warms up by itself, while this thread goes on
            _state.compiler.start(arch or WARM_UP_ARCH, _state.config.for_kernel("proteus_warm_up"),
                                  _state.driver_version or None)
            spec_mod.prepare_keys(_state.config, _state.driver_version or None)
            _trace("specialization", "compiler process started")
        else:
            ms = spec_mod.warm_up(arch or WARM_UP_ARCH, _state.config, _state.driver_version or None)
            _trace("specialization", f"compiler ready ({ms:.0f} ms)")
    except Exception as exc:  # a real compilation will meet it again and report it per kernel
        _trace("specialization", f"preparing the compiler: {type(exc).__name__}: {exc}")
    return True


def _run_key() -> str:
    assert _state is not None
    return run_key([f.sha256 for t in _state.tables for f in t.fatbins])


def _last_run() -> int | None:
    """How many variants the app's last run compiled, from its note in the disk cache."""
    assert _state is not None
    if not _state.last_run_read:
        disk = next((level for level in _state.cache.levels if isinstance(level, StorageCache)), None)
        if disk is not None and _state.tables:
            entry = disk.get(_run_key(), counted=False)
            if entry is not None and entry.kind == RUN_KIND:
                _state.last_run = decode_run(entry.data)
        _state.last_run_read = True
    return _state.last_run


def compiled_this_run() -> int:
    """Variants compiled, or queued for a compile thread and not compiled, in this process."""
    assert _state is not None
    return sum(s.specializations + len(s.queued) for s in _state.stats)


def finish() -> None:
    """At exit, from the shim: save the tracker's decisions no compile thread saved, and note
    for the next run whether this one compiled, where that changes its guess
    (policy.compiles_likely); a steady run writes nothing."""
    try:
        if _state is None or not _state.tables or _state.config.disable:
            return
        _save_policies()
        compiled = compiled_this_run()
        if (compiled > 0) != compiles_likely(_last_run()):
            _state.cache.put(Entry(_run_key(), RUN_KIND, 0, encode_run(compiled), {"kernel": "(the app's last run)"}),
                             enforce_cap=False)
    except Exception as exc:  # never into C
        _trace("specialization", f"noting the run: {type(exc).__name__}: {exc}")


def load_failed(kid: int, code: int) -> None:
    assert _state is not None
    record = _state.kernels[kid][1]
    reason = (f"hipModuleLoadData/hipModuleGetFunction failed with HIP error {code}" if isinstance(record.arch, str)
              else f"cuModuleLoadData/cuModuleGetFunction failed with CUDA error {code}")
    stats = _state.stats[kid]
    stats.failures[reason] = stats.failures.get(reason, 0) + 1
    _warn_once(f"load:{record.name}", f"{record.demangled}: {reason}; running the original kernel")


# What the shim passes write_report, in this order (times in ns): starting Python, all misses
# (that start included where a launch started it), their number, the compiler warm-up, the wait
# for compile threads at exit, what the prestart thread did (bit 0 Python, bit 1 the compiler),
# launches that waited for a variant compiling in the background (time, number), the misses'
# time by stage, launches that asked their stream for such a variant and did not wait (time,
# number), the CPU of the app's main() thread, of the compile threads and of the prestart
# thread; then CLOCK_MONOTONIC when the shim was loaded, main started and returned (0 where the
# shim does not wrap main; an app that ends with exit() has no main CPU) and the report began.
WAIT_FIELDS = ("python_start", "misses", "miss_count", "prepare_compiler", "exit", "prestart", "compiling",
               "compiling_count", "lock", "resolve", "track", "specialize", "queue", "gil", "compiling_checks",
               "compiling_check_count", "app_main_cpu", "compile_threads_cpu", "prestart_cpu", "deferred_count",
               "shim_loaded", "main_start", "main_end", "report")
MISS_STAGES = ("lock", "resolve", "track", "specialize", "queue", "gil")


def _wait_sections(waits: tuple[int, ...]) -> dict:
    """The report's shim_wait_ms, threads_ms, timeline_ns and prestart from the shim's figures."""
    if len(waits) != len(WAIT_FIELDS):
        return {"shim_wait_ms": {}, "prestart": {}}
    w = dict(zip(WAIT_FIELDS, waits))

    def ms(ns: int) -> float:
        return round(ns / 1e6, 2)

    start, end, report = w["main_start"], w["main_end"], w["report"]
    return {
        # what the app's threads spent waiting on the shim: never a hit, only misses and exit;
        # compiling: launches that waited for their variant to finish compiling (auto mode);
        # miss_stages: the compile lock, a kernel's first launch, the value tracker, the caches
        # (or, compiling there, the compilation), queueing, and apart, before the tracker and the
        # caches, waiting for the GIL (held by a compile or the prestart thread); compiling_checks: launches that
        # asked again for a variant still compiling, found their stream idle and ran the original
        "shim_wait_ms": {"python_start": ms(w["python_start"]), "misses": ms(w["misses"]), "miss_count": w["miss_count"],
                         "prepare_compiler": ms(w["prepare_compiler"]), "exit": ms(w["exit"]),
                         "compiling": ms(w["compiling"]), "compiling_count": w["compiling_count"],
                         "miss_stages": {f: ms(w[f]) for f in MISS_STAGES},
                         "compiling_checks": ms(w["compiling_checks"]),
                         "compiling_check_count": w["compiling_check_count"],
                         # of miss_count, launches handed to the tracker later, with no Python call
                         "deferred_count": w["deferred_count"]},
        # where the CPU went: the app's main() against the shim's own threads, and what came
        # between main's return and this report (exit handlers, destructors)
        "threads_ms": {"app_main_wall": ms(end - start) if start and end else 0.0, "app_main_cpu": ms(w["app_main_cpu"]),
                       "compile_threads_cpu": ms(w["compile_threads_cpu"]), "prestart_cpu": ms(w["prestart_cpu"]),
                       "after_main": ms(report - end) if end else 0.0},
        # the same instants on a parent's clock: a benchmark places them in its run
        "timeline_ns": {f: w[f] for f in ("shim_loaded", "main_start", "main_end", "report")},
        # what the shim's prestart thread did before the first launch (PROTEUS_PRESTART)
        "prestart": {"python": bool(w["prestart"] & 1), "compiler": bool(w["prestart"] & 2)},
    }


def write_report(path: str, counters: bytes, unknown_launches: int = 0, waits: tuple[int, ...] = ()) -> None:
    """PROTEUS_REPORT: per kernel, launches, specialized launches, variants, cache hits, compile ms, fallbacks.
    `waits`, from the shim: WAIT_FIELDS, in that order (ns, counts, CLOCK_MONOTONIC times).
    Without them (a test), the report has no waits."""
    t_report = time.perf_counter()
    assert _state is not None
    if _profile is not None:
        _profile.disable()
        try:
            _profile.dump_stats(os.environ["PROTEUS_PROFILE"])
        except OSError as exc:
            print(f"proteus: warning: {os.environ['PROTEUS_PROFILE']}: cannot write the profile: {exc.strerror or exc}",
                  file=sys.stderr, flush=True)
    kernels, off = [], 0
    while off + 52 <= len(counters):
        kid, launches, hits, fallbacks, launch_errors, compiling, gpu_us = struct.unpack_from("<iQQQQQQ", counters, off)
        end = counters.index(b"\0", off + 52)
        name = counters[off + 52 : end].decode(errors="replace")
        off = end + 1
        entry = {"name": name, "launches": launches, "fallback_launches": fallbacks + launch_errors + compiling,
                 "launch_errors": launch_errors, "launches_while_compiling": compiling,
                 "gpu_ms_estimate": round(gpu_us / 1000.0, 3)}
        if kid >= 0:
            s = _state.stats[kid]
            entry.update(
                demangled=s.demangled,
                globals=list(_state.kernels[kid][1].globals),
                specialized_launches=launches - fallbacks - launch_errors - compiling,
                table_hits=hits,
                specializations=s.specializations,
                memory_cache_hits=s.memory_hits,
                disk_cache_hits=s.disk_hits,
                compile_ms=round(s.compile_ms, 2),
                failures=s.failures,
                variants=s.variants,
                # queued for a compile thread but not compiled when the run ended (prewarm compiles them)
                not_compiled=list(s.queued.values()),
                budget_refusals=s.budget_refusals,
            )
            if s.tracker is not None:
                record = _state.kernels[kid][1]
                entry["tracker"] = {"distinct_variants": s.tracker.variants, "stopped_folding": s.tracker.dropped,
                                    "learned_from_earlier_runs": s.tracker.learned,
                                    "folded_now": [record.params[i].index for i in sorted(s.tracker.folded)],
                                    "dims_now": [d for d, bit in ((BLOCK, 1), (GRID, 2)) if s.tracker.dims & bit]}
        else:
            entry.update(specialized_launches=0, failures={"not specialized": fallbacks})
        kernels.append(entry)
    doc = {
        "tool": f"proteus-rewrite {__version__}",
        "pid": os.getpid(),
        "driver_version": _state.driver_version,
        "unknown_handle_launches": unknown_launches,  # launches of kernels the shim never saw registered
        "async_compilation": _state.config.async_compilation,
        "seconds": round(time.time() - _state.started, 3),
        **_wait_sections(waits),
        "stores": [t.app.name for t in _state.tables],
        "cache": {name: vars(s) for name, s in _state.cache.stats().items()},
        # where variants compile: a process of its own (None: in the app's, PROTEUS_COMPILE_PROCESS=0)
        "compiler_process": _state.compiler.report() if _state.compiler is not None else None,
        "kernels": kernels,
    }
    if doc["prestart"]:  # left cold ahead: the app's last run compiled nothing (policy.compiles_likely)
        doc["prestart"]["compiler_skipped"] = _state.warm_up_skipped
    if "threads_ms" in doc:   # this report's own cost, up to writing it (a cold run's is larger)
        doc["threads_ms"]["report"] = round((time.perf_counter() - t_report) * 1e3, 2)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".report-", dir=directory)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, path)
    except OSError as exc:
        print(f"proteus: warning: {path}: cannot write the report: {exc.strerror or exc}", file=sys.stderr, flush=True)
