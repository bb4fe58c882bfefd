"""PROTEUS_VALIDATE: a variant's first launch checked against the original kernel.

Three modes. By default (`once`) each new variant is checked once ever: its image answer asks
the shim for a check (protocol.IMAGE_CHECK) until a run has stored the check's verdict beside it
in the cache, so a warm run checks nothing; a run spends a bounded share of its time checking
(PROTEUS_VALIDATE_BUDGET), and a variant waiting for its check runs the original meanwhile.
`PROTEUS_VALIDATE=1` (full, for CI and `proteus-rewrite validate`) checks every variant's first
launch in every run, with no budget. `PROTEUS_VALIDATE=0` checks nothing (upstream Proteus's
behaviour).

The shim (shim/cuda_validate.c) snapshots every allocation the launch's arguments point into
(and the kernel's device variables), runs the variant and the original on the snapshot, keeps
what each wrote on the GPU, restores the snapshot and lets the app's own launch run the original.
A compare kernel tells equal from different; equal, the variant serves the rest of the run
(checked); different, the results come here: the kernel is denied, and runs the original from
then on, in this run and (the deny list in the cache directory, and in a store written with
`proteus-rewrite APP --validate`) in every later one. The memory the app goes on with is always
the original's, so a checked launch prints the native output. A check that cannot be made (too
large, a launch that cannot be repeated, a printf module, an original whose own results vary)
leaves the variant unchecked: by default it runs as it would without the check, and the report
says why; in full mode the original runs for the rest of the run.

What it cannot see is in docs/user/validate.md: one input, one run, memory outside the
allocations the arguments point into.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from . import protocol
from .files import atomic_write
from .session import Session

DENY_FILE = "validate-deny.json"  # the single list earlier versions rewrote: read, no longer written
DENY_DIR = "validate-deny.d"  # one file per denial, <deny_key(name)>.json
DENY_KIND = "deny"  # the cache entry kind of a denial (the chain's tiers, the shared one included)
CHECKED_KIND = "checked"  # the cache entry kind of a variant's check verdict (once mode: never checked again)
# the cache entry kind of a kernel whose original's own results varied at a check (once mode: its
# later variants are not checked, since a check of them can only end the same way)
VARIES_KIND = "varies"
RANGE = protocol.VALIDATE_RANGE


@dataclass
class Difference:
    base: int
    size: int
    bytes_differing: int
    first_offset: int
    max_ulps: float  # the smallest ULP distance that covers every differing word, as float32 or float64
    sampled: bool = False  # too many differing words: max_ulps is over the first MAX_WORDS of them


@dataclass
class Outcome:
    kernel: str
    folded: dict[str, object]
    verdict: str  # "same", "within-ulps", "differs", "varies" (the original's own results vary), "skipped"
    reason: str = ""
    allocations: int = 0
    bytes_compared: int = 0
    differences: list[Difference] = field(default_factory=list)
    ms: float = 0.0


def _ulp_distance(a: int, b: int, bits: int) -> float:
    """Distance in units in the last place between two floats given as their bit patterns; NaN
    against anything else and infinities against finite values are infinitely far."""
    sign = 1 << (bits - 1)
    fmt = "<f" if bits == 32 else "<d"
    ints = "<I" if bits == 32 else "<Q"
    fa = struct.unpack(fmt, struct.pack(ints, a))[0]
    fb = struct.unpack(fmt, struct.pack(ints, b))[0]
    if math.isnan(fa) or math.isnan(fb):
        return 0.0 if math.isnan(fa) and math.isnan(fb) else math.inf
    if math.isinf(fa) or math.isinf(fb):
        return 0.0 if fa == fb else math.inf
    # map sign-magnitude onto a monotonic integer line
    ka = (sign - (a & (sign - 1))) if a & sign else sign + a
    kb = (sign - (b & (sign - 1))) if b & sign else sign + b
    return float(abs(ka - kb))


CHUNK = 4096
MAX_WORDS = 1 << 20  # differing words read as floats; beyond, a sample (Difference.sampled)


def compare(original: bytes, variant: bytes) -> tuple[int, int, float, bool]:
    """(differing bytes, first differing offset, ULPs, sampled). The allocation's element type
    is not known: the ULP distance is the largest over the differing aligned words read as
    float32, or as float64, whichever is smaller (a change confined to a word's low bits is
    small in both readings). Chunks are compared by the C code of bytes and ints, so that a
    gigabyte of equal memory costs no Python loop; at most MAX_WORDS differing words are read
    as floats (sampled: True when there were more)."""
    if original == variant:
        return 0, -1, 0.0, False
    n = min(len(original), len(variant))
    count, first, starts = abs(len(original) - len(variant)), -1, []
    for off in range(0, n, CHUNK):
        a, b = original[off : min(off + CHUNK, n)], variant[off : min(off + CHUNK, n)]
        if a == b:
            continue
        x = (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")
        count += len(a) - x.count(0)
        if first < 0:
            first = off + next(i for i, c in enumerate(x) if c)
        starts.append(off)
    worst, sampled = {}, False
    for bits, width, fmt in ((32, 4, "I"), (64, 8, "Q")):
        d, seen = 0.0, 0
        for off in starts:
            end = min(off + CHUNK, n)
            if (end - off) % width:  # a tail shorter than a word: no float reading of it
                d = math.inf
                end -= (end - off) % width
            wa = memoryview(original[off:end]).cast(fmt)
            wb = memoryview(variant[off:end]).cast(fmt)
            for u, v in zip(wa, wb):
                if u != v:
                    d = max(d, _ulp_distance(u, v, bits))
                    seen += 1
            if seen >= MAX_WORDS:
                sampled = sampled or off + CHUNK < n
                break
        worst[bits] = d
    if first < 0:
        first = n
    return count, first, min(worst.values()), sampled


def _cache_dir(session: Session) -> Path:
    return Path(session.config.cache_dir or _default_cache_dir())


def _default_cache_dir() -> Path:
    from ..cache import default_cache_dir

    return default_cache_dir()


def deny_key(name: str) -> str:
    """The cache key of a denial of kernel `name` (an Entry of kind DENY_KIND), and its file's
    name in DENY_DIR."""
    return hashlib.sha256(f"validate-deny\0{name}".encode()).hexdigest()


def _read_one(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the validation deny list: {exc}", path) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("denied", {}), dict):
        raise InputError("not a validation deny list (no 'denied' object)", path)
    return doc.get("denied", {})


def read_deny(cache_dir: Path) -> dict[str, dict]:
    """The denials in the cache directory `cache_dir`: kernel name -> what the validation found
    ({} when none). The union of DENY_DIR's files (one per denial, each written whole by one
    process: no lock, no lost update) and an old-style DENY_FILE. A file that cannot be read
    raises InputError after the others are read (its denials are the only ones lost)."""
    out = dict(_read_one(cache_dir / DENY_FILE))
    bad: InputError | None = None
    try:
        names = sorted(os.listdir(cache_dir / DENY_DIR))
    except FileNotFoundError:
        names = []
    except OSError as exc:
        raise InputError(f"cannot read the validation deny list: {exc.strerror or exc}", cache_dir / DENY_DIR) from None
    for n in names:
        if n.startswith(".") or not n.endswith(".json"):  # a writer's temporary file
            continue
        try:
            out.update(_read_one(cache_dir / DENY_DIR / n))
        except InputError as exc:
            bad = bad or exc
    if bad is not None:
        bad.partial = out  # type: ignore[attr-defined]  what could be read: denied() keeps it
        raise bad
    return out


def _from_cache(session: Session, name: str) -> dict | None:
    """A denial another rank published to the cache chain (the shared tier, PROTEUS_CACHE_SHARED),
    or None."""
    cache = getattr(session, "cache", None)
    if cache is None:
        return None
    try:
        hit = cache.get(deny_key(name), counted=False)
    except Exception:  # noqa: BLE001  a tier that fails: what the directory says stands
        return None
    if hit is None or hit[0].kind != DENY_KIND:
        return None
    try:
        doc = json.loads(hit[0].data)
    except ValueError:
        return None
    record = doc.get("denied", {}).get(name) if isinstance(doc, dict) and isinstance(doc.get("denied"), dict) else None
    return record if isinstance(record, dict) else None


def denied(session: Session, name: str) -> dict | None:
    """Why `name` is denied (by its store, the cache directory's list, or a denial in the cache
    chain, which reaches other ranks through the shared tier), or None."""
    if session.deny is None:
        session.deny = {}
        for table in session.tables:
            session.deny.update(table.denied)
        try:
            session.deny.update(read_deny(_cache_dir(session)))
        except InputError as exc:
            session.deny.update(getattr(exc, "partial", {}))
            session.warn_once("deny-list", str(exc))
    if name not in session.deny and name not in session.deny_checked:
        session.deny_checked.add(name)
        if (record := _from_cache(session, name)) is not None:
            session.deny[name] = record
    return session.deny.get(name)


def _persist(session: Session, name: str, record: dict) -> None:
    """One file per denial in DENY_DIR (a unique temporary file renamed into place: concurrent
    ranks denying different kernels lose nothing, a reader never sees half a file), and an
    entry of kind DENY_KIND in the cache chain, for ranks that share a tier."""
    doc = json.dumps({"tool": "proteus-rewrite", "denied": {name: record}}, indent=1).encode()
    path = _cache_dir(session) / DENY_DIR / f"{deny_key(name)}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(str(path), doc)
    except OSError as exc:
        session.warn_once("deny-write", f"{path}: cannot write the validation deny list: {exc.strerror or exc}")
    cache = getattr(session, "cache", None)
    if cache is not None:
        from ..cache import Entry

        try:
            cache.put(Entry(deny_key(name), DENY_KIND, 0, doc, {"kernel": name}), enforce_cap=False)
        except Exception:  # noqa: BLE001  the directory's file is the record; the tier is a courtesy
            pass


def mode() -> str:
    """PROTEUS_VALIDATE, read as the shim reads it: "once" (unset or empty, the default), "off"
    (0, false, no) or "full" (1 or any other nonzero number, true, yes)."""
    v = os.environ.get("PROTEUS_VALIDATE", "").strip()
    if not v or v.lower() == "once":
        return "once"
    if v[:1] in ("t", "T", "y", "Y") or (v.lstrip("-").isdigit() and int(v) != 0):
        return "full"
    return "off"


def requested() -> bool:
    """Every variant checked in every run (PROTEUS_VALIDATE=1)."""
    return mode() == "full"


def _checked_key(variant_key: str) -> str:
    return hashlib.sha256(f"checked:{variant_key}".encode()).hexdigest()


def check_flag(session: Session, variant_key: str, validates: bool) -> int:
    """protocol.IMAGE_CHECK where the shim must check the variant before it serves a launch: in
    full mode always; by default until a run has stored the check's verdict."""
    m = mode()
    if not validates or m == "off":
        return 0
    if m == "full":
        return protocol.IMAGE_CHECK
    hit = session.cache.get(_checked_key(variant_key), counted=False)
    return 0 if hit is not None and hit[0].kind == CHECKED_KIND else protocol.IMAGE_CHECK


def _remember(session: Session, kid: int, vid: int, verdict: str, reason: str = "") -> None:
    """A check's verdict into the variant's report entry and, by default, beside the variant in
    the cache, so that no later run checks it again."""
    from ..cache import Entry

    try:
        variant = session.stats[kid].variants[vid]
        record = session.kernels[kid][1]
        doc = {"verdict": verdict, **({"reason": reason} if reason else {})}
        variant["check"] = doc
        if mode() != "once" or verdict == "differs":  # (a difference denies the kernel: the deny list keeps it)
            return
        session.cache.put(Entry(_checked_key(variant["cache_key"]), CHECKED_KIND, record.arch, json.dumps(doc).encode(),
                                {"kernel": record.demangled}), enforce_cap=False)
    except (IndexError, KeyError):
        pass


def _tolerance(session: Session) -> float:
    text = os.environ.get("PROTEUS_VALIDATE_ULPS", "").strip()
    try:
        return float(text) if text else 0.0
    except ValueError:
        session.warn_once("validate-ulps", f"PROTEUS_VALIDATE_ULPS={text!r}: not a number; using 0")
        return 0.0


def _folded(session: Session, kid: int, args: bytes) -> dict[str, object]:
    from ..jit.launch import python_value

    record = session.kernels[kid][1]
    out, off = {}, 0
    for p in record.params:
        raw = args[off : off + p.size]
        off += p.size
        if p.kind != "pointer":
            try:
                out[str(p.index)] = python_value(p, raw)
            except Exception:  # noqa: BLE001  a struct: its bytes
                out[str(p.index)] = raw.hex()
    return out


VARIES = ("the original kernel's own results vary from run to run ({} on the same memory: atomics or races), so its "
          "variant cannot be compared")


VARIED = ("its original kernel's own results varied from run to run at an earlier check (atomics or races): its "
          "variants run unchecked")


def _varies_key(session: Session, kid: int) -> str:
    """The cache key of kernel `kid`'s mark (VARIES_KIND), by its name and module: a rebuilt
    kernel is checked afresh."""
    table, record = session.kernels[kid]
    module = table.modules[record.module].sha256 if record.module is not None else ""
    return hashlib.sha256(f"validate-varies\0{record.name}\0{module}".encode()).hexdigest()


def _varies(session: Session, kid: int, vid: int, outcome: Outcome, how: str) -> None:
    """The original's own two runs disagree: nothing to hold the variant to (reported; by default
    the variant runs unchecked and is not tried again, and neither is the check of the kernel's
    other variants, in this run (the shim) or later ones (the mark in the cache))."""
    from ..cache import Entry

    outcome.verdict = "varies"
    outcome.reason = VARIES.format(how)
    session.validation.append(outcome)
    runs = "the original kernel runs in this run" if requested() else "its variant runs unchecked"
    session.warn_once(f"validate-varies:{session.kernels[kid][1].name}",
                      f"{outcome.kernel}: not validated ({outcome.reason}); {runs}")
    _remember(session, kid, vid, "unchecked", outcome.reason)
    if mode() == "once":
        record = session.kernels[kid][1]
        session.cache.put(Entry(_varies_key(session, kid), VARIES_KIND, record.arch,
                                json.dumps({"reason": outcome.reason}).encode(), {"kernel": record.demangled}),
                          enforce_cap=False)


def checked(session: Session, kid: int, vid: int, verdict: str, args: bytes, allocations: int, size: int,
            ms: float) -> None:
    """The shim compared the results on the GPU: the variant's equal the original's ("same"), or
    the original's two runs disagree ("varies": in full mode the original runs for the rest of
    the run, by default the variant runs unchecked)."""
    try:
        record = session.kernels[kid][1]
        outcome = Outcome(record.demangled, _folded(session, kid, args), verdict, allocations=allocations,
                          bytes_compared=size, ms=round(ms, 2))
        if verdict == "varies":
            _varies(session, kid, vid, outcome, "its two runs differ")
            return
        session.validation.append(outcome)
        session.trace("variants", f"{record.demangled}: validated (same, {allocations} allocations, {size} bytes)")
        _remember(session, kid, vid, "same")
    except Exception as exc:  # noqa: BLE001  never an exception into C: the variant stays checked this run
        print(f"proteus: validation: internal error ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)


def validated(session: Session, kid: int, vid: int, args: bytes, ranges: bytes, variant: bytes, original: bytes,
              shadow: bytes, ms: float) -> int:
    """The shim's check of one variant whose results differ from the original's, or that the
    GPU could not compare (the results of the ranges read back, back to back: by the GPU's
    compare, those where the variant's differ; without it, all): 0 keeps the variant; 1 denies the kernel (its results differ); 2 the
    original's own two runs, `shadow` and `original`, disagree: nothing to compare against (in
    full mode the original runs for the rest of this run; by default the variant runs unchecked)."""
    try:
        record = session.kernels[kid][1]
        outcome = Outcome(record.demangled, _folded(session, kid, args), "same", ms=round(ms, 2))
        if shadow and shadow != original:
            outcome.allocations = len(ranges) // RANGE.size
            outcome.bytes_compared = len(original)
            _varies(session, kid, vid, outcome, f"{compare(shadow, original)[0]} bytes differ between two runs")
            return 2
        off = 0
        for i in range(0, len(ranges), RANGE.size):
            base, size, read = RANGE.unpack_from(ranges, i)
            outcome.allocations += 1
            outcome.bytes_compared += size
            if not read:  # equal on the GPU: not read back
                continue
            a, b = original[off : off + size], variant[off : off + size]
            off += size
            count, first, ulps, sampled = compare(a, b)
            if count:
                outcome.differences.append(Difference(base, size, count, first, ulps, sampled))
        if outcome.differences:
            worst = max(d.max_ulps for d in outcome.differences)
            tolerance = _tolerance(session)
            # no tolerance: bit for bit (-0.0 against 0.0 is 0 ULPs apart, and still a difference);
            # a sampled distance proves no bound
            sampled = any(d.sampled for d in outcome.differences)
            outcome.verdict = "within-ulps" if tolerance > 0 and worst <= tolerance and not sampled else "differs"
        session.validation.append(outcome)
        if outcome.verdict != "differs":
            session.trace("variants", f"{record.demangled}: validated ({outcome.verdict}, {outcome.allocations} "
                          f"allocations, {outcome.bytes_compared} bytes)")
            _remember(session, kid, vid, outcome.verdict)
            return 0
        worst = max(outcome.differences, key=lambda d: d.max_ulps)
        reason = (f"its variant wrote different results: {sum(d.bytes_differing for d in outcome.differences)} bytes in "
                  f"{len(outcome.differences)} of {outcome.allocations} allocations, the largest difference "
                  f"{_ulps_text(worst.max_ulps)} at offset {worst.first_offset} of the {worst.size}-byte allocation at "
                  f"{worst.base:#x}; its scalar arguments {outcome.folded}")
        outcome.reason = reason
        entry = {"reason": reason, "folded": outcome.folded, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "modules": [session.kernels[kid][0].modules[record.module].sha256] if record.module is not None else []}
        if session.deny is not None:
            session.deny[record.name] = entry
        _remember(session, kid, vid, "differs", reason)
        _persist(session, record.name, entry)
        print(f"proteus: validation: {record.demangled}: {reason}; denied (the original kernel runs, in this run and "
              f"later ones)", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001  never an exception into C: deny, to be safe
        print(f"proteus: validation: internal error ({type(exc).__name__}: {exc}); the original kernel runs",
              file=sys.stderr, flush=True)
        return 1


def refusal(session: Session, kid: int) -> bytes:
    """Why the shim must not run this kernel's variant in the original's shadow (b"" if it may):
    a kernel whose module calls printf would print twice (and the app's output would not be
    the native one), judged per module (the bitcode names vprintf); by default, a kernel whose
    original's results varied at an earlier run's check (full mode checks it anyway)."""
    table, record = session.kernels[kid]
    modules = [table.modules[i] for i in (record.module, *record.link_modules) if i is not None]
    if any(b"vprintf" in m.code for m in modules):
        return b"its module calls printf, which running it in the original's shadow would print twice"
    if mode() == "once":
        hit = session.cache.get(_varies_key(session, kid), counted=False)
        if hit is not None and hit[0].kind == VARIES_KIND:
            return VARIED.encode()
    return b""


def skipped(session: Session, kid: int, vid: int, reason: str) -> None:
    """The shim could not check a variant (too large, a launch it cannot repeat, ...): in full
    mode the kernel runs the original for the rest of this run; by default the variant runs
    unchecked, as without the check, and is not tried again. The report says why."""
    record = session.kernels[kid][1]
    session.validation.append(Outcome(record.demangled, {}, "skipped", reason))
    if requested():
        session.warn_once(f"validate-skip:{record.name}", f"{record.demangled}: not validated ({reason}); the original "
                          "kernel runs")
    else:
        session.trace("variants", f"{record.demangled}: not validated ({reason}); its variant runs unchecked")
        _remember(session, kid, vid, "unchecked", reason)


def _ulps_text(u: float) -> str:
    return "not a number or infinite" if math.isinf(u) else f"{u:.0f} ULPs"


def report_section(session: Session) -> list[dict]:
    """The report's "validation" list: one entry per check, in order."""
    out = []
    for o in session.validation:
        d = {"kernel": o.kernel, "verdict": o.verdict, "folded": o.folded, "allocations": o.allocations,
             "bytes_compared": o.bytes_compared, "ms": o.ms}
        if o.reason:
            d["reason"] = o.reason
        if o.differences:
            d["differences"] = [{"base": hex(x.base), "size": x.size, "bytes_differing": x.bytes_differing,
                                 "first_offset": x.first_offset,
                                 "max_ulps": None if math.isinf(x.max_ulps) else x.max_ulps} for x in o.differences]
        out.append(d)
    return out
