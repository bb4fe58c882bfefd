"""Speed trials (PROTEUS_SPEED_CHECK): which new variants the shim times against the original
kernel, and what it found, remembered per variant in the cache.

The shim does the timing (shim/trial.c): a variant the cache has no verdict for takes turns with
the original on live launches from its first, each timed with a pair of events, and is dropped
when measured slower. At exit it hands over each trial (protocol.VARIANT) with its times. A
decided one is kept in the cache as an entry of its own, so that the next run launches a kept
variant without timing it and never launches one found slower. One the run's launches left
undecided (a kernel launched once or a few times) is kept with its times, and the next run's
trial adds to them, starting with the side timed less, until `judge` has enough. The report
shows every trial beside its variant, and each kernel's time against the original.
"""

from __future__ import annotations

import hashlib
import json
import statistics

from ..cache import Entry
from . import protocol
from .session import Session

SPEED_KIND = "speed"  # the cache entry kind of a verdict


def _key(variant_key: str) -> str:
    return hashlib.sha256(f"speed:{variant_key}".encode()).hexdigest()


def judge(original: list[float], variant: list[float], final: bool) -> str:
    """The verdict on the launches timed so far, in microseconds: "kept", "slower" or "undecided".
    The shim's rule (shim/trial.c judge): decided early where the two sides do not overlap, from
    one launch a side for a kernel of TRIAL_LONG_US or more, two for a shorter one; at the end
    (final) by the medians: slower when the variant's is above the original's by more than
    TRIAL_MARGIN and TRIAL_FLOOR_US and every variant launch is above the original's median."""
    if not original or not variant:
        return "undecided"
    mo, mv = statistics.median(original), statistics.median(variant)
    gap = mv - mo
    beyond = gap > protocol.TRIAL_MARGIN * mo and gap > protocol.TRIAL_FLOOR_US
    need = 1 if min(mo, mv) >= protocol.TRIAL_LONG_US else 2
    if len(original) >= need and len(variant) >= need:
        if max(variant) < min(original):
            return "kept"
        if min(variant) > max(original) and beyond:
            return "slower"
    if not final:
        return "undecided"
    return "slower" if beyond and min(variant) > mo else "kept"


def _stored(session: Session, variant_key: str) -> dict | None:
    hit = session.cache.get(_key(variant_key), counted=False)
    if hit is None or hit[0].kind != SPEED_KIND:
        return None
    try:
        doc = json.loads(hit[0].data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("verdict") in protocol.TRIAL_VERDICTS else None


def remembered(session: Session, variant_key: str) -> tuple[dict | None, int]:
    """An earlier run's verdict on the variant cached under `variant_key` (None: not judged), and
    the image flags of a variant not judged: a trial, begun with the original where earlier runs
    timed the variant more."""
    doc = _stored(session, variant_key) or {}
    if doc.get("verdict") in protocol.TRIAL_VERDICTS[1:]:
        return doc, 0
    first = len(_times(doc, "original_us")) < len(_times(doc, "variant_us"))
    return None, protocol.IMAGE_TRIAL | (protocol.IMAGE_ORIGINAL_FIRST if first else 0)


def _times(doc: dict, side: str) -> list[float]:
    v = doc.get(side)
    return [float(x) for x in v if isinstance(x, (int, float)) and x > 0] if isinstance(v, list) else []


def _figures(original: list[float], variant: list[float]) -> dict:
    doc: dict = {"timed_launches": len(original) + len(variant)}
    if original and variant:
        doc.update(original_median_us=round(statistics.median(original), 2), original_min_us=round(min(original), 2),
                   variant_median_us=round(statistics.median(variant), 2), variant_min_us=round(min(variant), 2))
        doc["variant_over_original"] = round(doc["variant_median_us"] / doc["original_median_us"], 3)
    return doc


def received(session: Session, records: bytes) -> None:
    """At exit, what the shim followed of each variant (protocol.VARIANT): a speed trial into the
    variant's report entry and into the cache, decided or with its times for the next run; its
    launches, where counted (the cache-stats trace), into the entry's `launches`."""
    for at in range(0, len(records) - protocol.VARIANT.size + 1, protocol.VARIANT.size):
        t = protocol.unpack_variant(records, at)
        kid, vid = t["kid"], t["variant"]
        if not (0 <= kid < len(session.stats)) or not (0 <= vid < len(session.stats[kid].variants)):
            continue
        variant = session.stats[kid].variants[vid]
        if t["launches"]:
            variant["launches"] = t["launches"]
        if not variant.pop("trial", False):
            continue
        earlier = _stored(session, variant["cache_key"]) or {}
        original = (_times(earlier, "original_us") + _times(t, "original"))[-protocol.TRIAL_RUNS:]
        timed = (_times(earlier, "variant_us") + _times(t, "variant_us"))[-protocol.TRIAL_RUNS:]
        shim = protocol.TRIAL_VERDICTS[t["verdict"]] if t["verdict"] < len(protocol.TRIAL_VERDICTS) else "undecided"
        verdict = shim if shim != "undecided" else judge(
            original, timed, len(original) >= protocol.TRIAL_RUNS and len(timed) >= protocol.TRIAL_RUNS)
        doc = {"verdict": verdict, **_figures(original, timed),
               "runs": (earlier["runs"] if isinstance(earlier.get("runs"), int) else 0) + 1,
               "original_us": [round(x, 2) for x in original], "variant_us": [round(x, 2) for x in timed]}
        if earlier and shim == "undecided" and verdict != "undecided":
            doc["judged_over_runs"] = True
        variant["speed"] = doc
        if not original and not timed:
            continue  # never timed: nothing to keep for the next run
        record = session.kernels[kid][1]
        session.cache.put(Entry(_key(variant["cache_key"]), SPEED_KIND, record.arch, json.dumps(doc).encode(),
                                {"kernel": record.demangled}), enforce_cap=False)
        if verdict == "slower":
            session.trace("variants", f"{record.demangled}: variant {variant['key']} is slower than the original "
                          f"({doc['variant_median_us']} us against {doc['original_median_us']} us): dropped")


def kernel_ratio(variants: list[dict]) -> float | None:
    """The kernel's time against the original's, over its timed variants (their geometric mean):
    below 1, the variants won."""
    ratios = [v["speed"]["variant_over_original"] for v in variants
              if isinstance(v.get("speed"), dict) and v["speed"].get("variant_over_original")]
    if not ratios:
        return None
    product = 1.0
    for r in ratios:
        product *= r
    return round(product ** (1 / len(ratios)), 3)
