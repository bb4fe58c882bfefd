"""The shim's calls into Python (protocol.CALLS names them and their argument formats): each
takes the process's one Session, made by init, and passes it to the module that does the work.
Nothing else in the run time holds the Session in a global.

The shim calls init before anything else; finish and warm_set are also called where init
failed or never ran, and then do nothing.
"""

from __future__ import annotations

import logging
import os
import sys

from . import flow, lifecycle, report, validate, warm
from . import miss as miss_mod
from .launch import decode_launch
from .session import Session
from .session import kernel_info as _kernel_info

log = logging.getLogger("proteus_rewrite")

_session: Session | None = None  # one per process, as the shim's tables are


def state() -> Session:
    """The process's session (init must have run): for tests and benchmarks."""
    assert _session is not None, "runtime.init has not run"
    return _session


def reset() -> None:
    """Forget the session (tests: a fresh init)."""
    global _session
    _session = None


def init(shim_dir: str, driver_version: int) -> bool:
    """Once, when Python has started: the session over the stores beside the shim. False: a bad
    PROTEUS_* setting, said in one line (the app then runs as built)."""
    global _session
    profile = None
    if os.environ.get("PROTEUS_PROFILE"):  # cProfile of every call into the run time, written with the report
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("proteus: warning: %(message)s"))  # the shim only logs warnings
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False
    session = Session.open(shim_dir, driver_version)
    if session is None:
        return False
    session.profile = profile
    _session = session
    return True


def kernel_info(image_ptr: int, name: str, arch: int | str) -> bytes | None:
    return _kernel_info(state(), image_ptr, name, arch)


def track(kid: int, args: bytes, grid: tuple, block: tuple, earlier: bytes = b"") -> bytes:
    """A launch whose key the shim's table lacks: the kernel's policy (miss.track)."""
    session = state()
    return miss_mod.track(session, kid, decode_launch(session.kernels[kid][1], args, grid, block), earlier)[0]


def track_deferred(kid: int, earlier: bytes) -> bytes:
    """Launches the shim deferred (their variants queued unasked), from a compile thread before
    it takes a job, which a policy they change makes stale, and at exit: the policy."""
    return miss_mod.track(state(), kid, None, earlier)[0]


def miss(kid: int, args: bytes, grid: tuple, block: tuple, globals_: bytes, arch: int | str, gpu_ms: float = 0.0,
         cached_only: int = 0, earlier: bytes = b"") -> bytes:
    session = state()
    launch = decode_launch(session.kernels[kid][1], args, grid, block, globals_)
    return miss_mod.miss(session, kid, launch, arch, gpu_ms, cached_only, earlier)


def specialize(kid: int, args: bytes, grid: tuple, block: tuple, globals_: bytes, arch: int | str,
               gpu_ms: float = 0.0, cached_only: int = 0) -> bytes | None:
    session = state()
    launch = decode_launch(session.kernels[kid][1], args, grid, block, globals_)
    return flow.specialize(session, kid, launch, arch, gpu_ms, cached_only)


def load_failed(kid: int, code: int) -> None:
    flow.load_failed(state(), kid, code)


def prepare_compiler(arch: int, ahead: int = 0) -> bool:
    return lifecycle.prepare_compiler(state(), arch, ahead)


def compiled_this_run() -> int:
    return lifecycle.compiled_this_run(state())


def warm_set(images: bytes) -> bytes:
    return warm.warm_set(_session, images)


def finish(counters: bytes = b"", trials: bytes = b"") -> None:
    if _session is not None:
        lifecycle.finish(_session, counters, trials)


def write_report(path: str, counters: bytes, unknown_launches: int = 0, waits: tuple[int, ...] = ()) -> None:
    report.write_report(state(), path, counters, unknown_launches, waits)


def checked(kid: int, vid: int, verdict: str, args: bytes, allocations: int, size: int, ms: float) -> None:
    validate.checked(state(), kid, vid, verdict, args, allocations, size, ms)


def validated(kid: int, vid: int, args: bytes, ranges: bytes, variant: bytes, original: bytes, shadow: bytes,
              ms: float) -> int:
    return validate.validated(state(), kid, vid, args, ranges, variant, original, shadow, ms)


def validate_skipped(kid: int, vid: int, reason: str) -> None:
    validate.skipped(state(), kid, vid, reason)


def validate_refusal(kid: int) -> bytes:
    return validate.refusal(state(), kid)
