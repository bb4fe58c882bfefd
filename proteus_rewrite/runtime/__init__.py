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
    warm_set(images) -> bytes                 the launches whose variants the app's last run used, to load
                                              before its first launch (warm.py)
    finish(counters, trials)                  at exit: the speed trials' verdicts, and whether this run
                                              compiled (the next run's guess)
    write_report(path, counters, unknown, waits)  at exit, for PROTEUS_REPORT
    checked(kid, vid, verdict, args, allocations, size, ms)  a variant's check, told on the GPU: same or varies
    validated(kid, vid, args, ranges, variant, original, shadow, ms) -> 1 to deny   a check found them not
    validate_skipped(kid, vid, reason)        a variant PROTEUS_VALIDATE could not check
    validate_refusal(kid) -> bytes            why a kernel's variants must not be checked (b"" if they may)

These are entry.py's, each a thin wrapper that hands the process's one Session (made by init) to
the module that does the work:

    session    the Session: stores, resolved kernels and their statistics, caches, compiler; kernel_info
    launch     a launch's bytes decoded once (decode_launch), for the tracker and the flow
    miss       the value tracker (track), and the one-call miss: the tracker, then the flow
    flow       the miss flow: decode, budget, cache, compile, verdict
    lifecycle  the compiler's preparation, the note on what a run compiled, finish
    warm       a warm run's first launches answered ahead, and the note they come from
    report     the report's schema: written at exit, read back (LaunchRecord: a variant's launch)
    speed, validate, trace, protocol, files

Kernel stores (*.kstore) are found beside the shim (or in PROTEUS_STORE_DIR). A loaded
image is matched to a recorded fat binary by the SHA-256 of its bytes, so a store that
does not belong to the running binary (say, the app was rebuilt) matches nothing and the
app simply runs its original kernels. `arch` is an SM version (CUDA, 90) or the device's
processor (HIP: its gcnArchName, "gfx90a:sramecc+:xnack-"; the features are dropped). Every failure here becomes one warning per kernel
and a None, never an exception into C.
"""

from .entry import (
    checked,
    compiled_this_run,
    finish,
    init,
    kernel_info,
    load_failed,
    miss,
    prepare_compiler,
    reset,
    specialize,
    state,
    track,
    track_deferred,
    validate_refusal,
    validate_skipped,
    validated,
    warm_set,
    write_report,
)
from .lifecycle import WARM_UP_ARCH

__all__ = ["WARM_UP_ARCH", "checked", "compiled_this_run", "finish", "init", "kernel_info", "load_failed", "miss",
           "prepare_compiler", "reset", "specialize", "state", "track", "track_deferred", "validate_refusal", "validate_skipped",
           "validated", "warm_set", "write_report"]
