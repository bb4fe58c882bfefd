"""The tier interface every cache level implements, and what the tiers share to implement it.

The interface is duck-typed; cache.MemoryCache, disk_tier.StorageCache, file_tier.SharedFileTier
and redis_tier.RedisTier implement it, and cache.CacheChain calls nothing else:

    name: str                                   "memory", "disk", "shared", "redis"
    stats: LevelStats                           hits, misses, puts, corrupt, evicted, refused, ...
    get(key, counted=True) -> Entry | None      counted=False: not in the report's hit/miss counts
    put(entry, enforce_cap=True) -> None        raises CacheError on failure
    claim(key: str, lease_s: float) -> Claim | None
                                                before compiling `key`; None: another process (or
                                                thread) holds a live claim on it. A claim whose
                                                holder died, or stopped renewing for lease_s by the
                                                waiter's own monotonic clock, is broken by claim()
    renew(claim) -> bool                        the holder, while it compiles (a renewal thread);
                                                False: the claim was broken meanwhile
    release(claim) -> None                      token-checked: a broken and retaken claim stays
    tombstone(key: str, arch, reason: str) -> None
                                                publish "this variant failed" (an Entry of kind
                                                TOMBSTONE), so that other processes do not retry it
    trim(max_mb: float) -> int                  delete the oldest entries down to max_mb; the
                                                number deleted. Only `cache trim` calls it on a
                                                shared tier (no client evicts there)
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("proteus_rewrite")

DEFAULT_LEASE_S = 30.0
QUARANTINE_AGE_S = 600.0  # a damaged shared entry younger than this may be mid-publish: left alone


@dataclass
class LevelStats:
    hits: int = 0
    misses: int = 0
    puts: int = 0
    corrupt: int = 0
    evicted: int = 0
    refused: int = 0  # entries without a valid HMAC where a secret is configured
    write_failures: int = 0
    quarantined: int = 0


@dataclass(frozen=True)
class Claim:
    """The right to compile `key` (one holder per key at a time), taken from tier `tier`."""

    key: str
    token: str
    tier: str
    taken_at: float  # time.time() when taken
    handle: object = field(default=None, compare=False, repr=False)  # the tier's own (a path)


def _token() -> str:
    return uuid.uuid4().hex


def trim_oldest(entries: list[tuple[Path, os.stat_result]], max_mb: float, stats: LevelStats) -> int:
    """Delete the entries with the oldest modification times until the rest fit in max_mb; the
    number deleted (another process deleting one first is no error)."""
    entries = sorted(entries, key=lambda e: e[1].st_mtime)
    total = sum(st.st_size for _, st in entries)
    limit, n = int(max_mb * 1024 * 1024), 0
    for p, st in entries:
        if total <= limit:
            break
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        total -= st.st_size
        n += 1
        stats.evicted += 1
    return n


def _alive(pid: int) -> bool:
    """Whether process `pid` of this host runs: a zombie is dead, and one this user may not
    signal counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]
