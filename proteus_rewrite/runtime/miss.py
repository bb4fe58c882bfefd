"""What the shim asks on a miss (a launch whose key its table lacks): the value tracker's policy
(track), and in one call the tracker and then the miss flow (miss; flow.py)."""

from __future__ import annotations

import struct
import time

from ..policy import BLOCK, GRID, Tracker
from . import flow, protocol
from .launch import RawLaunch, decode_deferred
from .session import Session


def track(session: Session, kid: int, launch: RawLaunch | None, earlier: bytes = b"") -> tuple[bytes, bool]:
    """The kernel's policy, which the shim's key follows from now on (u32 dims: bit 0 block,
    bit 1 grid; u8 fold[nparams]; b"" for a kernel without a tracker, whose policy never
    changes), after the tracker has seen the launches the shim deferred (`earlier`,
    protocol.DEFERRED each, in order) and then `launch` (None: none); and whether they changed
    it."""
    record, stats = session.kernels[kid][1], session.stats[kid]
    tracker = stats.tracker
    if tracker is None:
        return b"", False
    before = len(tracker.dropped)
    try:
        for seen in decode_deferred(record, earlier):
            _see(tracker, seen)
        if launch is not None:
            _see(tracker, launch)
    except Exception as exc:  # never into C; the policy simply stays as it was
        session.warn_once(f"track:{record.name}", f"{record.demangled}: value tracker: {type(exc).__name__}: {exc}")
    changed = len(tracker.dropped) != before
    if changed and stats.policy_key:  # the next run starts from here: saved off this thread (Session.save_policies)
        stats.policy_unsaved = True
    policy = protocol.POLICY_HEAD.pack(tracker.dims) + bytes(1 if i in tracker.folded else 0 for i in range(len(record.params)))
    return policy, changed


def _see(tracker: Tracker, launch: RawLaunch) -> None:
    tracker.before({**{i: launch.args[i] for i in tracker.folded},
                    BLOCK: struct.pack("<3I", *launch.block), GRID: struct.pack("<3I", *launch.grid)})


def miss(session: Session, kid: int, launch: RawLaunch, arch: int | str, gpu_ms: float = 0.0, cached_only: int = 0,
         earlier: bytes = b"") -> bytes:
    """A launch whose key the shim's table lacks, in one call: one wait for the GIL on the
    launching thread where track and specialize took two (at a cold start, while the prestart
    or a compile thread runs Python, each such wait was up to the switch interval or longer).
    The tracker sees the launch, after the ones the shim deferred; if that changed the kernel's
    policy, the launch's key is stale and nothing more is done (protocol.MISS_POLICY_CHANGED:
    the shim builds the key anew and calls specialize); otherwise the flow answers
    (protocol.MISS_IMAGE, with the image, empty when it needs compiling; protocol.MISS_ORIGINAL
    for None). Layout: MISS_HEADER, the policy (as track), the image."""
    t0 = time.perf_counter_ns()
    policy, changed = track(session, kid, launch, earlier)
    tracked = min(time.perf_counter_ns() - t0, 0xFFFFFFFF)
    if changed:
        return protocol.MISS_HEADER.pack(protocol.MISS_POLICY_CHANGED, tracked, len(policy)) + policy
    image = flow.specialize(session, kid, launch, arch, gpu_ms, cached_only)
    if image is None:
        return protocol.MISS_HEADER.pack(protocol.MISS_ORIGINAL, tracked, len(policy)) + policy
    return protocol.MISS_HEADER.pack(protocol.MISS_IMAGE, tracked, len(policy)) + policy + image
