"""The contract between the shim (C) and the run time (Python), declared once.

Everything that crosses the boundary is here: the byte layouts either side packs or reads, the
argument formats of every Python function the shim calls (Py_BuildValue/PyObject_CallFunction
format strings), the order of the shim's counters in the report, and the PROTEUS_* variables
the shim reads itself. The Python side uses these objects; the C side includes
shim/protocol.h, which `python -m proteus_rewrite.runtime > shim/protocol.h` generates from this
file (tests/unit/test_protocol.py fails when the two drift apart).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..jit.config import AUTO_COMPILE_THREADS_MAX, CPUS_PER_COMPILE_THREAD, MAX_COMPILE_THREADS

# ---------------------------------------------------------------- byte layouts

# runtime.kernel_info's answer: this header, then u32 sizes[nparams], u8 fold[nparams], then
# nglobals NUL-terminated device-variable names. dims: bit 0 the block is in the key, bit 1 the
# grid. defer_max: how many launches the shim may keep for the value tracker (DEFERRED).
KERNEL_INFO = struct.Struct("<5I")
KERNEL_INFO_FIELDS = ("kid", "nparams", "dims", "nglobals", "defer_max")
DIMS_BLOCK, DIMS_GRID = 1, 2

# A kernel's policy (track, track_deferred, and inside a miss answer): u32 dims, u8 fold[nparams].
POLICY_HEAD = struct.Struct("<I")

# A launch the shim kept for the tracker (defer()): u32 grid[3], u32 block[3], then the
# launch's argument bytes back to back.
DEFERRED = struct.Struct("<6I")
MAX_DEFERRED = 64  # kept per kernel at most: the shim holds them until a drain

# runtime.miss's answer: u8 status, u32 nanoseconds the tracker took, u32 policy length; then
# the policy; then the image (status MISS_IMAGE; empty: it needs compiling).
MISS_HEADER = struct.Struct("<BII")
MISS_POLICY_CHANGED, MISS_IMAGE, MISS_ORIGINAL = 0, 1, 2

# A variant's image, as specialize and miss answer it: u32 length of its entry point's name, u32
# variant (its index in the kernel's report + 1: the shim reports it back under it, see
# VARIANT), u32 flags (IMAGE_TRIAL: time it against the original first; IMAGE_ORIGINAL_FIRST: its
# trial's first turn runs the original, which earlier runs timed less; IMAGE_CHECK: compare its
# first launch's results with the original's before it serves any, PROTEUS_VALIDATE), the name
# (no NUL), then
# the image (cubin, PTX or code object). An empty answer has no header: it needs compiling.
IMAGE_HEADER = struct.Struct("<III")
IMAGE_TRIAL = 1
IMAGE_ORIGINAL_FIRST = 2
IMAGE_CHECK = 4


def image_answer(entry: str, image: bytes, variant: int = 0, flags: int = 0) -> bytes:
    name = entry.encode()
    return IMAGE_HEADER.pack(len(name), variant, flags) + name + image


def split_image_answer(answer: bytes) -> tuple[str, bytes, int, int]:
    """image_answer's inverse, as the shim reads it: (the entry's name, the image, the variant,
    the flags)."""
    n, variant, flags = IMAGE_HEADER.unpack_from(answer)
    start = IMAGE_HEADER.size
    return answer[start:start + n].decode(), answer[start + n:], variant, flags


# The prestart thread's question, runtime.warm_set: the fat binaries the app registered (u64
# addresses, IMAGE_ADDRESS each). The answer, per launch whose variant the app's last run used
# and the caches hold (WARM_ITEM): u64 the fat binary's address, u32 grid[3], u32 block[3], u32
# the SM version the answers are for, u32 nparams, u32 lengths of the kernel's name, of the arguments, of its kernel_info answer and of
# its variant's image answer; then the name (no NUL), u8 known[nparams] (1: the argument's
# bytes are the launch's; the others are zero), the arguments' bytes back to back, the
# kernel_info answer (KERNEL_INFO) and the image answer (IMAGE_HEADER), both made ahead.
IMAGE_ADDRESS = struct.Struct("<Q")
# specialize's and miss's cached_only: 0 may compile, CACHED_ONLY asks the caches (a miss that
# queues what they lack), CACHED_AHEAD the same for a launch loaded ahead (nothing is queued)
CACHED_ONLY, CACHED_AHEAD = 1, 2
WARM_ITEM = struct.Struct("<Q12I")


# Speed trials (shim/trial.c, runtime/speed.py judge, one rule in both): each side's timed
# launches per run, and when a variant counts as slower: its median above the original's by
# more than TRIAL_MARGIN and TRIAL_FLOOR_US. A kernel whose launches take TRIAL_LONG_US or more
# is judged from one launch a side when the two sides do not overlap; a shorter one needs two.
TRIAL_RUNS = 6
TRIAL_MARGIN = 0.01
TRIAL_FLOOR_US = 1.0
TRIAL_LONG_US = 1000.0

# What the shim reports at exit about a variant it followed (a speed trial, PROTEUS_SPEED_CHECK,
# or the launches of each for upstream's cache-stats lines): i32 kid, u32 variant (its index in
# the kernel's report), u32 verdict (TRIAL_VERDICTS; "undecided" where no trial ran or it did not
# end), u32 timed launches of the original and of the variant, f32 GPU microseconds of each timed
# launch (TRIAL_RUNS of the original, then of the variant; those past the counts are 0), u64
# launches that ran it (counted with cache-stats only; else 0).
VARIANT = struct.Struct(f"<iIIII{2 * TRIAL_RUNS}fQ")
TRIAL_VERDICTS = ("undecided", "kept", "slower")


def unpack_variant(records: bytes, at: int) -> dict:
    """One VARIANT record: kid, variant, verdict, original and variant (their timed launches'
    microseconds) and launches."""
    f = VARIANT.unpack_from(records, at)
    n_o, n_v, times = f[3], f[4], f[5:5 + 2 * TRIAL_RUNS]
    return {"kid": f[0], "variant": f[1], "verdict": f[2], "original": list(times[:min(n_o, TRIAL_RUNS)]),
            "variant_us": list(times[TRIAL_RUNS:TRIAL_RUNS + min(n_v, TRIAL_RUNS)]), "launches": f[-1]}


def pack_variant(kid: int, variant: int, verdict: str, original: list[float], variant_us: list[float],
                 launches: int = 0) -> bytes:
    """unpack_variant's inverse, as the shim writes it (tests)."""
    pad = [0.0] * TRIAL_RUNS
    return VARIANT.pack(kid, variant, TRIAL_VERDICTS.index(verdict), len(original), len(variant_us),
                        *(list(original) + pad)[:TRIAL_RUNS], *(list(variant_us) + pad)[:TRIAL_RUNS], launches)


# Per kernel, what the shim hands write_report: i32 kid (-1: never specialized), u64 launches,
# table hits, fallbacks, launch errors, launches while its variant compiled, launches into a
# stream capture (recorded into a graph: what its node runs is decided at instantiation),
# launches that ran the original to time a variant against it (TRIAL), sampled GPU
# microseconds, kernel nodes of instantiated graphs pointed at a variant, launches that ran the
# original while their variant waited for its check or had it (IMAGE_CHECK: the checked launch
# itself, the run's budget spent, another thread checking it); then the kernel's name,
# NUL-terminated.
COUNTERS = struct.Struct("<iQQQQQQQQQQ")
COUNTER_FIELDS = ("kid", "launches", "hits", "fallbacks", "launch_errors", "compiling", "captured", "timing", "gpu_us",
                  "graph_nodes", "awaiting_check")

# Where a variant's check spends its time (shim/cuda_validate.c): the context's idle point,
# the allocations and the snapshot; the variant's and the original's runs on it; waiting for the
# app's own launch; the compare kernel; reading results back; the run time's calls; freeing
CHECK_PHASES = ("prepare", "shadow", "app", "compare", "readback", "python", "free")

# The shim's report figures, in the order it passes them (ns, counts, CLOCK_MONOTONIC times).
WAIT_FIELDS = ("python_start", "misses", "miss_count", "prepare_compiler", "exit", "prestart", "compiling",
               "compiling_count", "lock", "resolve", "track", "specialize", "queue", "gil", "load", "compiling_checks",
               "compiling_check_count", "app_main_cpu", "compile_threads_cpu", "prestart_cpu", "deferred_count", "preloaded",
               "shim_loaded", "main_start", "main_end", "report", "checks", "check_count",
               *(f"check_{p}" for p in CHECK_PHASES))
MISS_STAGES = ("lock", "resolve", "track", "specialize", "queue", "gil", "load")


# ---------------------------------------------------------------- calls from C into Python


@dataclass(frozen=True)
class Call:
    """A runtime function the shim calls, and the format its arguments are built with
    (y# and s# take Py_ssize_t lengths: the shim calls the _SizeT variant)."""

    name: str
    format: str | None  # None: no arguments


CALLS = (
    Call("init", "si"),                                   # shim directory, driver version
    Call("kernel_info", "Ksi"),                            # image address, kernel name, SM version
    Call("kernel_info_hip", "Kss"),                        # ... the device's processor name (HIP)
    Call("track", "iy#(III)(III)y#"),                      # kid, args, grid, block, deferred records
    Call("track_deferred", "iy#"),                         # kid, deferred records
    Call("miss", "iy#(III)(III)y#idiy#"),                  # kid, args, grid, block, globals, arch, GPU ms, cached only, deferred
    Call("miss_hip", "iy#(III)(III)y#sdiy#"),              # ... the device's processor name (HIP)
    Call("specialize", "iy#(III)(III)y#idi"),              # the same, without the deferred records
    Call("specialize_hip", "iy#(III)(III)y#sdi"),          # ... the device's processor name (HIP)
    Call("load_failed", "ii"),                             # kid, driver error code
    Call("prepare_compiler", "i"),                         # SM version (0: unknown)
    Call("prepare_compiler_ahead", "ii"),                  # SM version, ahead (may decline)
    Call("warm_set", "y#"),                                # the registered fat binaries (IMAGE_ADDRESS each)
    Call("finish", "y#y#"),                                # the per-kernel counters (COUNTERS), the variants (VARIANT each)
    Call("write_report", "sy#K(" + "K" * len(WAIT_FIELDS) + ")"),  # path, counters, unknown launches, WAIT_FIELDS
    Call("checked", "iisy#iKd"),                           # kid, variant, verdict (same, varies: told on the GPU), args,
                                                           # allocations, bytes, ms
    Call("validated", "iiy#y#y#y#y#d"),                    # kid, variant, args, ranges (VALIDATE_RANGE each), the variant's
                                                           # results, the original's, its shadow run's (b"": none), ms;
                                                           # results of the ranges read back only, back to back
    Call("validate_skipped", "iis"),                       # kid, variant, why it was not checked
    Call("validate_refusal", "i"),                         # kid -> why its variants cannot be checked ("" if they can)
)

# PROTEUS_VALIDATE: one allocation the check compared, as the shim describes it (u64 base, u64 size,
# u64 read: 1 where its bytes follow in the results, 0 where the GPU found both sides equal there)
VALIDATE_RANGE = struct.Struct("<QQQ")

# The shim's own PROTEUS_* variables (it reads them before Python runs, or without it).
SHIM_ENV = ("PROTEUS_DISABLE", "PROTEUS_TRACE_OUTPUT", "PROTEUS_PRESTART", "PROTEUS_STORE_DIR",
            "PROTEUS_ASYNC_COMPILATION", "PROTEUS_ASYNC_THREADS", "PROTEUS_REPORT", "PROTEUS_FAULT_INJECT",
            "PROTEUS_VALIDATE", "PROTEUS_VALIDATE_MAX_MB", "PROTEUS_VALIDATE_BUDGET", "PROTEUS_VALIDATE_GRACE_MS",
            "PROTEUS_PRELOAD")


# ---------------------------------------------------------------- the C header


def header() -> str:
    """shim/protocol.h, as generated from this module."""
    c = [
        "/* Generated by `python -m proteus_rewrite.runtime > shim/protocol.h` from",
        " * proteus_rewrite/runtime/protocol.py: edit that file, not this one. */",
        "#ifndef PROTEUS_PROTOCOL_H",
        "#define PROTEUS_PROTOCOL_H",
        "",
        "/* runtime.kernel_info's answer: u32 " + ", ".join(KERNEL_INFO_FIELDS) + "; u32 sizes[]; u8 fold[]; names */",
        f"#define PROTO_KINFO_HEAD {KERNEL_INFO.size}",
        *[f"#define PROTO_KINFO_{f.upper()} {i}" for i, f in enumerate(KERNEL_INFO_FIELDS)],
        f"#define PROTO_DIMS_BLOCK {DIMS_BLOCK}",
        f"#define PROTO_DIMS_GRID {DIMS_GRID}",
        "",
        "/* a policy: u32 dims, u8 fold[nparams] */",
        f"#define PROTO_POLICY_HEAD {POLICY_HEAD.size}",
        "",
        "/* a deferred launch: u32 grid[3], u32 block[3], the argument bytes */",
        f"#define PROTO_DEFER_HEAD {DEFERRED.size}",
        f"#define PROTO_MAX_DEFERRED {MAX_DEFERRED}",
        "",
        "/* runtime.miss's answer: u8 status, u32 tracker ns, u32 policy length; policy; image */",
        f"#define PROTO_MISS_HEAD {MISS_HEADER.size}",
        "#define PROTO_MISS_STATUS_AT 0",
        "#define PROTO_MISS_TRACK_NS_AT 1",
        "#define PROTO_MISS_POLICY_LEN_AT 5",
        f"#define PROTO_MISS_POLICY_CHANGED {MISS_POLICY_CHANGED}",
        f"#define PROTO_MISS_IMAGE {MISS_IMAGE}",
        f"#define PROTO_MISS_ORIGINAL {MISS_ORIGINAL}",
        "",
        "/* a variant's image: u32 name length, u32 variant (index + 1), u32 flags, the name, the image */",
        f"#define PROTO_IMAGE_HEAD {IMAGE_HEADER.size}",
        "#define PROTO_IMAGE_VARIANT_AT 4",
        "#define PROTO_IMAGE_FLAGS_AT 8",
        f"#define PROTO_IMAGE_TRIAL {IMAGE_TRIAL}",
        f"#define PROTO_IMAGE_ORIGINAL_FIRST {IMAGE_ORIGINAL_FIRST}",
        f"#define PROTO_IMAGE_CHECK {IMAGE_CHECK}",
        "",
        "/* a variant followed, at exit: i32 kid, u32 variant, verdict, timed launches of the original and",
        " * of the variant; f32 us of each (TRIAL_RUNS a side); u64 launches */",
        f"#define PROTO_VARIANT {VARIANT.size}",
        f"#define TRIAL_RUNS {TRIAL_RUNS}",
        f"#define TRIAL_MARGIN {TRIAL_MARGIN}f",
        f"#define TRIAL_FLOOR_MS {TRIAL_FLOOR_US / 1000}f",
        f"#define TRIAL_LONG_MS {TRIAL_LONG_US / 1000}f",
        *[f"#define PROTO_TRIAL_{v.upper()} {i}" for i, v in enumerate(TRIAL_VERDICTS)],
        "",
        "/* per kernel for write_report: i32 " + ", ".join(COUNTER_FIELDS[:1]) + ", u64 " + ", ".join(COUNTER_FIELDS[1:])
        + "; name\\0 */",
        f"#define PROTO_COUNTERS {COUNTERS.size}",
        f"#define PROTO_COUNTERS_U64 {len(COUNTER_FIELDS) - 1}",
        "",
        "/* runtime.warm_set: u64 addresses; per launch: u64 fat binary, u32 grid[3], block[3], arch, nparams,",
        " * lengths of the name, arguments, kernel_info and image answers; then each of those */",
        f"#define PROTO_IMAGE_ADDRESS {IMAGE_ADDRESS.size}",
        f"#define PROTO_WARM_ITEM {WARM_ITEM.size}",
        f"#define CACHED_ONLY {CACHED_ONLY}",
        f"#define CACHED_AHEAD {CACHED_AHEAD}",
        "",
        "/* PROTEUS_VALIDATE: an allocation compared, u64 base, u64 size, u64 read back */",
        f"#define PROTO_VALIDATE_RANGE {VALIDATE_RANGE.size}",
        "",
        "/* the shim's report figures, in write_report's order */",
        "enum {",
        *[f"  W_{f.upper()}," for f in WAIT_FIELDS],
        "  W_COUNT",
        "};",
        "enum {",
        *[f"  MISS_{s.upper()}," for s in MISS_STAGES],
        "  MISS_STAGES",
        "};",
        "enum {",
        *[f"  CHECK_{s.upper()}," for s in CHECK_PHASES],
        "  CHECK_PHASES",
        "};",
        "",
        "/* runtime functions the shim calls: their names, and their arguments' formats */",
        *[f'#define CALL_{call.name.upper()} "{call.name.replace("_hip", "").replace("_ahead", "")}"' for call in CALLS],
        *[f'#define FMT_{call.name.upper()} {chr(34) + call.format + chr(34) if call.format else "NULL"}' for call in CALLS],
        "",
        "/* PROTEUS_ASYNC_THREADS: auto (unset) is a thread per CPUS_PER_COMPILE_THREAD CPUs, 1 to the max */",
        f"#define CPUS_PER_COMPILE_THREAD {CPUS_PER_COMPILE_THREAD}",
        f"#define AUTO_COMPILE_THREADS_MAX {AUTO_COMPILE_THREADS_MAX}",
        f"#define MAX_COMPILE_THREADS {MAX_COMPILE_THREADS}",
        "",
        "/* PROTEUS_* variables the shim reads itself */",
        *[f'#define ENV_{v[len("PROTEUS_"):]} "{v}"' for v in SHIM_ENV],
        "",
        "#endif",
        "",
    ]
    return "\n".join(c)

