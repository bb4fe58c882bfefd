"""Speed trials (PROTEUS_SPEED_CHECK): which new variants the shim times against the original
kernel, and what it found, remembered per variant in the cache.

The shim does the timing (shim/trial.c): a variant the cache has no verdict for runs a few
launches, then takes turns with the original on live launches, each timed with a pair of
events, and is dropped when measured slower. At exit it hands over each trial (protocol.VARIANT);
the decided ones are kept in the cache as entries of their own, so that the next run launches a
kept variant without timing it and never launches one found slower. The report shows every
trial beside its variant, and each kernel's time against the original.
"""

from __future__ import annotations

import hashlib
import json

from ..cache import Entry
from . import protocol
from .session import Session

SPEED_KIND = "speed"  # the cache entry kind of a verdict


def _key(variant_key: str) -> str:
    return hashlib.sha256(f"speed:{variant_key}".encode()).hexdigest()


def remembered(session: Session, variant_key: str) -> dict | None:
    """An earlier run's verdict on the variant cached under `variant_key`, or None."""
    hit = session.cache.get(_key(variant_key), counted=False)
    if hit is None or hit[0].kind != SPEED_KIND:
        return None
    try:
        doc = json.loads(hit[0].data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("verdict") in protocol.TRIAL_VERDICTS[1:] else None


def _ratio(doc: dict) -> float | None:
    o, v = doc.get("original_median_us") or 0.0, doc.get("variant_median_us") or 0.0
    return round(v / o, 3) if o > 0 and v > 0 else None


def received(session: Session, records: bytes) -> None:
    """At exit, what the shim followed of each variant (protocol.VARIANT): a speed trial into the
    variant's report entry and, decided, into the cache; its launches, where counted (the
    cache-stats trace), into the entry's `launches`."""
    for at in range(0, len(records) - protocol.VARIANT.size + 1, protocol.VARIANT.size):
        t = dict(zip(protocol.VARIANT_FIELDS, protocol.VARIANT.unpack_from(records, at)))
        kid, vid = t["kid"], t["variant"]
        if not (0 <= kid < len(session.stats)) or not (0 <= vid < len(session.stats[kid].variants)):
            continue
        variant = session.stats[kid].variants[vid]
        if t["launches"]:
            variant["launches"] = t["launches"]
        if not variant.pop("trial", False):
            continue
        doc = {"verdict": protocol.TRIAL_VERDICTS[t["verdict"]] if t["verdict"] < len(protocol.TRIAL_VERDICTS) else "undecided",
               "timed_launches": t["timed"]}
        if doc["verdict"] != "undecided":
            doc.update({f: round(t[f], 2) for f in protocol.VARIANT_FIELDS[4:8]})
            doc["variant_over_original"] = _ratio(doc)
            record = session.kernels[kid][1]
            session.cache.put(Entry(_key(variant["cache_key"]), SPEED_KIND, record.arch, json.dumps(doc).encode(),
                               {"kernel": record.demangled}), enforce_cap=False)
            if doc["verdict"] == "slower":
                session.trace("variants", f"{record.demangled}: variant {variant['key']} is slower than the original "
                              f"({doc['variant_median_us']} us against {doc['original_median_us']} us): dropped")
        variant["speed"] = doc


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
