"""The run time of one app process: a `Session` holds what it keeps between the shim's calls
(the kernel stores, the kernels the shim has resolved with their statistics, the caches, the
compiler process); `kernel_info` resolves a kernel at its first launch.

A process has one Session, made by entry.init; everything below the shim's entry points
(entry.py) takes it as an argument."""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import compat, store
from ..cache import CacheChain, StorageCache, make_chain
from ..errors import CacheError, ProteusError
from ..fatbin.extent import image_extent
from ..fatbin.table import KernelRecord, KernelTable
from ..jit import process
from ..jit.config import Config
from ..jit.launch import foldable
from ..jit.targets import best_record, target_for
from ..policy import POLICY_KIND, Tracker, decode_learned, policy_key, save_learned
from ..tiers import shared_from_config
from . import protocol


@dataclass
class KernelStats:
    name: str
    demangled: str
    specializations: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    compile_ms: float = 0.0
    compiling: dict[object, float] = field(default_factory=dict)  # compilations running now: their start (perf_counter)
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
    # variants an earlier run's speed trial found slower than the original (runtime/speed.py):
    # their launches run the original
    slower_declined: list[dict] = field(default_factory=list)


@dataclass(eq=False)
class Session:
    shim_dir: str
    driver_version: int
    config: Config
    cache: CacheChain
    tables: list[KernelTable]
    by_fatbin: dict[str, tuple[KernelTable, int]]  # container sha256 -> (table, fatbin index)
    by_entry: dict[str, tuple[KernelTable, int]]  # cubin sha256 -> (table, fatbin index)
    images: dict[int, tuple[KernelTable, int] | None] = field(default_factory=dict)
    # the resolved kernels, by the id the shim knows them by (their index): record and statistics
    kernels: list[tuple[KernelTable, KernelRecord]] = field(default_factory=list)
    stats: list[KernelStats] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.time)
    # variants the app's last run compiled (its note in the disk cache), once read; None: unknown
    last_run: int | None = None
    last_run_read: bool = False
    warm_note: bytes | None = None  # the note of the last run's variants, as read ahead (runtime/warm.py); b"": none
    warm_up_skipped: bool = False  # the prestart thread left the compiler cold: see policy.compiles_likely
    compiler: process.Compilers | None = None  # None: compile in this process (PROTEUS_COMPILE_PROCESS=0)
    validation: list = field(default_factory=list)  # PROTEUS_VALIDATE's outcomes (validate.Outcome)
    deny: dict | None = None  # kernels validation denied (stores and the cache directory's list), once read
    deny_checked: set = field(default_factory=set)  # names looked up as denial entries in the cache chain
    profile: object | None = None  # PROTEUS_PROFILE's cProfile.Profile, written with the report

    @classmethod
    def open(cls, shim_dir: str, driver_version: int) -> Session | None:
        """The session over the stores beside the shim (or in PROTEUS_STORE_DIR), configured
        from PROTEUS_*; None, said in one line, when a setting is bad (the app then runs as built)."""
        try:
            config = Config.from_env()
        except ProteusError as exc:
            print(f"proteus: error: {exc}; kernels run unspecialized", file=sys.stderr)
            return None
        for note in config.notes:  # settings that do nothing here, or were ignored: once each
            print(f"proteus: warning: {note}", file=sys.stderr)
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
            print(f"proteus: warning: no kernel store (*.kstore) in {store_dir}; kernels run unspecialized",
                  file=sys.stderr)
        if "specialization" in config.trace and config.use_stored_cache:  # upstream builds its cache chain here
            from . import trace

            for line in compat.cache_chain_setup_lines():
                trace.upstream(line)
        shared = None
        if config.use_stored_cache:
            try:
                shared = shared_from_config(config)  # PROTEUS_CACHE_SHARED: the ranks' cache
            except CacheError as exc:
                print(f"proteus: warning: {exc}; the shared cache is not used", file=sys.stderr)
        session = cls(shim_dir, driver_version, config,
                      make_chain(config.use_stored_cache, config.cache_dir, config.cache_max_mb, shared=shared), tables,
                      by_fatbin, by_entry)
        if config.compile_process:
            python = process.python_executable(_recorded_python(shim_dir))
            if python:
                session.compiler = process.Compilers(python, config.async_threads, quiet="variants" not in config.trace)
            else:
                session.trace("variants", "no Python executable to run the compiler in: compiling in the app's process")
        return session

    def warn_once(self, what: str, message: str) -> None:
        if what not in self.warned:
            self.warned.add(what)
            print(f"proteus: warning: {message}", file=sys.stderr, flush=True)

    def trace(self, token: str, message: str) -> None:
        if token in self.config.trace:
            print(f"proteus: {message}", file=sys.stderr, flush=True)

    def image(self, ptr: int) -> tuple[KernelTable, int] | None:
        """Which recorded fat binary the image at `ptr` (a fatbin wrapper, container or cubin;
        HIP: a wrapper, an offload bundle, plain or CCOB, or a code object) is: its bytes'
        SHA-256, as the store records it. Hashed once per address."""
        if ptr in self.images:
            return self.images[ptr]
        found = None
        extent = image_extent(lambda off, n: ctypes.string_at(ptr + off, n))
        if extent is not None:
            kind, size, read = extent
            digest = hashlib.sha256(read(0, size)).hexdigest()
            found = (self.by_entry if kind == "elf" else self.by_fatbin).get(digest)
        self.images[ptr] = found
        return found

    def fatbin_digests(self) -> list[str]:
        """The SHA-256 of every fat binary of the stores: what keys the notes on the app's runs."""
        return [f.sha256 for t in self.tables for f in t.fatbins]

    def disk(self) -> StorageCache | None:
        """The disk cache level, where the notes for the next run go (None: PROTEUS_USE_STORED_CACHE=0)."""
        return next((level for level in self.cache.levels if isinstance(level, StorageCache)), None)

    def save_policies(self) -> None:
        """Write the tracker decisions not saved yet to the disk cache. Not on a launching
        thread where that can be helped: a put is a dozen system calls, each a chance for
        another thread to take the GIL, which the launch then waits for. A compile thread does
        it before compiling, and finish at exit."""
        for (_, record), stats in zip(self.kernels, self.stats):
            if stats.policy_unsaved and stats.tracker is not None:
                stats.policy_unsaved = False
                save_learned(self.cache, stats.policy_key, record.arch, stats.tracker.dropped, record.demangled)


def _recorded_python(shim_dir: str) -> str | None:
    """The `executable` line of the shim's proteus-python.cfg (older ones have none)."""
    try:
        with open(os.path.join(shim_dir, "proteus-python.cfg")) as f:
            return next((line[len("executable "):].rstrip("\n") for line in f if line.startswith("executable ")), None)
    except OSError:
        return None


def kernel_info(session: Session, image_ptr: int, name: str, arch: int | str) -> bytes | None:
    """The C side's view of a kernel: u32 kid, nparams, dims flags, nglobals, defer (how many
    launches the shim may hand to the value tracker later: DEFERRED); u32 sizes[]; u8 fold[];
    NUL-terminated global names. None: run this kernel's original code, always."""
    try:
        return _kernel_info(session, image_ptr, name, arch)
    except Exception as exc:  # never let an exception reach the C caller
        session.warn_once(name, f"{name}: {type(exc).__name__}: {exc}; running the original kernel")
        return None


def _kernel_info(session: Session, image_ptr: int, name: str, arch: int | str) -> bytes | None:
    config = session.config
    if config.disable:
        return None
    match = session.image(image_ptr) if image_ptr else None
    if match is None:
        if session.tables:  # (with no store at all, open has already said so)
            session.warn_once(f"image:{image_ptr}", f"the fat binary of {name} is not in any kernel store (app rebuilt "
                                                    "since proteus-rewrite?); its kernels run unspecialized")
        return None
    table, fatbin = match
    candidates = [k for k in table.kernels if k.fatbin == fatbin and k.name == name]
    record = best_record(candidates, arch, config.code_kind)
    if record is None:
        built = ", ".join(sorted({str(k.arch) for k in candidates if k.specializable}))
        what = ("is not recorded" if not candidates
                else "has neither embedded bitcode nor PTX (a SASS-only build: keep PTX with nvcc -arch=sm_XX or "
                     "-gencode ...,code=compute_XX)" if not built
                else f"has no bitcode for {arch} (built for {built})" if target_for(arch).platform == "hip"
                else f"has code for {built} only, and PTX newer than the GPU ({arch}) does not assemble for it")
        session.warn_once(name, f"{name} {what}; running the original kernel")
        return None
    cg = config.for_record(record)
    allowed = set(record.jit_args) if record.jit_args is not None else None
    fold = bytes(
        1 if (cg.specialize_args and foldable(p, record.code, cg.ptx_fold_floats) and (allowed is None or p.index + 1 in allowed))
        or (cg.specialize_alignment and p.kind == "pointer") else 0
        for p in record.params
    )
    # the block is in the key where it reaches the code: as a launch bound anywhere, folded
    # (or as a range) where the target folds dims; the grid only there
    folds_dims = target_for(record.arch).folds_dims and (cg.specialize_dims or cg.specialize_dims_range)
    dims = (protocol.DIMS_BLOCK if cg.specialize_launch_bounds or folds_dims else 0) | (protocol.DIMS_GRID if folds_dims else 0)
    kid = len(session.kernels)
    session.kernels.append((table, record))
    stats = KernelStats(record.name, record.demangled)
    if config.tracker:
        fixed = frozenset(i - 1 for i in record.jit_args) if record.jit_args is not None else frozenset()
        stats.tracker = Tracker(config.tracker_threshold, config.tracker_ratio, {i for i, f in enumerate(fold) if f}, dims, fixed)
        stats.policy_key = _policy_key(session, table, record)
        saved = session.cache.get(stats.policy_key, counted=False)
        if saved is not None and saved[0].kind == POLICY_KIND:
            stats.tracker.start_from(decode_learned(saved[0].data))
            fold = bytes(1 if i in stats.tracker.folded else 0 for i in range(len(record.params)))
            dims = stats.tracker.dims
    session.stats.append(stats)
    sizes = struct.pack(f"<{len(record.params)}I", *(p.size for p in record.params))
    names = b"".join(g.encode() + b"\0" for g in record.globals)
    # T + 2: enough for a step counter's learning to pass without a Python call on the launching thread
    defer = min(config.tracker_threshold + 2, protocol.MAX_DEFERRED) if stats.tracker is not None else 0
    return protocol.KERNEL_INFO.pack(kid, len(record.params), dims, len(record.globals), defer) + sizes + fold + names


def _policy_key(session: Session, table: KernelTable, record: KernelRecord) -> str:
    fatbin = table.fatbin(record.fatbin)
    if fatbin is None:
        return ""
    return policy_key(fatbin.sha256, record.name, record.arch, session.config.tracker_threshold,
                      session.config.tracker_ratio)
