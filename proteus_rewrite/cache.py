"""The code cache: levels behind one get/put interface, first level first.

    MemoryCache   level 1: this process's entries (a dict; the shim keeps its own C table in front)
    StorageCache  level 2: one file per entry under PROTEUS_CACHE_DIR, shared by every process and
                  run of the node (disk_tier)
    SharedFileTier level 3 (optional): a directory many nodes share (`file:///shared/dir`,
                  file_tier, or a Redis server, redis_tier), named by PROTEUS_CACHE_SHARED and
                  opened by tiers.open_shared. A hit there fills the earlier levels.

CacheChain asks them in order and takes claims across them, so that one process per key
compiles. Each level implements the tier interface (tier_interface); what they store is
cache_entry's Entry, in its format.

The names of cache_entry, tier_interface and disk_tier that callers use are importable from
here too, so that the cache stays one import for them.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from .cache_entry import (
    FLAG_HMAC,
    HEADER,
    MAGIC,
    SUFFIX,
    TOMBSTONE,
    Entry,
    decode,
    decode_checked,
    describe,
    encode,
    tombstone_entry,
)
from .disk_tier import CLAIMS, LOCK, NO_LOCKS, RECOUNT_EVERY, USAGE, StorageCache, default_cache_dir
from .errors import CacheError
from .tier_interface import DEFAULT_LEASE_S, QUARANTINE_AGE_S, Claim, LevelStats, _token, log, trim_oldest

__all__ = [
    "CLAIMS", "DEFAULT_LEASE_S", "FLAG_HMAC", "HEADER", "LOCK", "MAGIC", "NO_LOCKS", "QUARANTINE_AGE_S",
    "RECOUNT_EVERY", "SUFFIX", "TOMBSTONE", "USAGE",
    "CacheChain", "ChainClaim", "Claim", "Entry", "LevelStats", "MemoryCache", "StorageCache",
    "decode", "decode_checked", "default_cache_dir", "describe", "encode", "make_chain", "tombstone_entry",
    "trim_oldest",
]


def _backoff(attempt: int, cap: float = 2.0) -> float:
    return min(cap, 0.02 * (2 ** min(attempt, 10))) * (0.5 + random.random() / 2)


class MemoryCache:
    name = "memory"

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self.stats = LevelStats()

    def get(self, key: str, counted: bool = True) -> Entry | None:
        """counted=False: a lookup the report's hit and miss counts leave out (not a kernel's)."""
        entry = self._entries.get(key)
        if counted and entry is None:
            self.stats.misses += 1
        elif counted:
            self.stats.hits += 1
        return entry

    def put(self, entry: Entry, enforce_cap: bool = True) -> None:
        self._entries[entry.key] = entry
        self.stats.puts += 1

    # claims between this process's threads (two compile threads missing one key)
    _claims_lock = threading.Lock()

    def _claims(self) -> dict[str, str]:
        if not hasattr(self, "_held"):
            self._held: dict[str, str] = {}
        return self._held

    def claim(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> Claim | None:
        with self._claims_lock:
            held = self._claims()
            if key in held:
                return None
            token = held[key] = _token()
        return Claim(key, token, self.name, time.time())

    def renew(self, claim: Claim) -> bool:
        return self._claims().get(claim.key) == claim.token

    def release(self, claim: Claim) -> None:
        with self._claims_lock:
            if self._claims().get(claim.key) == claim.token:
                del self._claims()[claim.key]

    def tombstone(self, key: str, arch, reason: str) -> None:
        self.put(tombstone_entry(key, arch, reason))

    def trim(self, max_mb: float) -> int:
        return 0


@dataclass
class ChainClaim:
    """The claims one CacheChain.claim took, one per level that takes claims."""

    key: str
    claims: list[tuple[object, Claim]]


class CacheChain:
    """Levels in order; a hit in a later level is copied into the earlier ones."""

    def __init__(self, levels: list, shared=None) -> None:
        self.levels = list(levels) + ([shared] if shared is not None else [])
        self.shared = shared
        self.put_errors: dict[str, int] = {}  # each put failure's message: how many times
        self.claim_stats: dict[str, float] = {"won": 0, "lost": 0, "broken": 0, "wait_s": 0.0, "shared_hits": 0,
                                              "write_failures": 0, "tombstones": 0}

    @property
    def lease_s(self) -> float:
        return getattr(self.shared, "lease_s", DEFAULT_LEASE_S)

    @property
    def disk(self) -> StorageCache | None:
        return next((level for level in self.levels if isinstance(level, StorageCache)), None)

    def get(self, key: str, counted: bool = True) -> tuple[Entry, str] | None:
        """counted=False: not a kernel's variant (a policy, a verdict): the levels' hit and miss
        counts, which the report and upstream's cache-stats lines show, leave it out."""
        for i, level in enumerate(self.levels):
            entry = level.get(key, counted)
            if entry is not None:
                if level is self.shared:
                    self.claim_stats["shared_hits"] += 1
                for earlier in self.levels[:i]:
                    try:
                        earlier.put(entry)
                    except CacheError as exc:
                        self._put_failed(exc)
                return entry, level.name
        return None

    def put(self, entry: Entry, enforce_cap: bool = True) -> None:
        for level in self.levels:
            try:
                level.put(entry, enforce_cap)
            except CacheError as exc:  # a full or read-only disk must not stop the JIT
                self._put_failed(exc)

    def _put_failed(self, exc: CacheError) -> None:
        # once: every later put fails alike; a tier that already warned it is gone says quiet
        if str(exc) not in self.put_errors and not getattr(exc, "quiet", False):
            log.warning("%s", exc)
        self.put_errors[str(exc)] = self.put_errors.get(str(exc), 0) + 1
        self.claim_stats["write_failures"] += 1

    def stats(self) -> dict[str, LevelStats]:
        return {level.name: level.stats for level in self.levels}

    # ---- claims: one compiler per key, in this process, on this node, and across nodes
    def claim(self, key: str, lease_s: float | None = None) -> ChainClaim | None:
        """Claim `key` at every level that takes claims, first level first; None (nothing held)
        when some level's claim is held elsewhere."""
        lease = self.lease_s if lease_s is None else lease_s
        taken: list[tuple[object, Claim]] = []
        for level in self.levels:
            if not hasattr(level, "claim"):
                continue
            before = getattr(level, "broken", 0)
            c = level.claim(key, lease)
            self.claim_stats["broken"] += getattr(level, "broken", 0) - before
            if c is None:
                for lv, cl in reversed(taken):
                    lv.release(cl)
                return None
            taken.append((level, c))
        self.claim_stats["won"] += 1
        return ChainClaim(key, taken)

    def renew(self, claim: ChainClaim) -> bool:
        return all(level.renew(c) for level, c in claim.claims)

    def release(self, claim: ChainClaim) -> None:
        for level, c in reversed(claim.claims):
            try:
                level.release(c)
            except Exception as exc:  # noqa: BLE001  a release that fails leaves a claim the lease breaks
                log.debug("cache: release of %s at %s failed: %s", claim.key[:16], level.name, exc)

    def tombstone(self, key: str, arch, reason: str) -> None:
        self.claim_stats["tombstones"] += 1
        for level in self.levels:
            try:
                level.tombstone(key, arch, reason)
            except CacheError as exc:
                self._put_failed(exc)

    def acquire(self, key: str, wait_s: float, counted: bool = False) -> tuple[Entry, str] | ChainClaim | None:
        """For a key no level holds: a claim to compile it, or, where another process holds the
        claim, wait (backing off) up to wait_s for its entry, or its claim to be broken, or
        nothing (None: the wait is over, or wait_s is 0). The hit (entry, level) when the entry
        appeared meanwhile."""
        claim = self._claim_fresh(key)
        if not isinstance(claim, ChainClaim) and claim is not None:
            return claim  # published between the caller's miss and the claim
        if claim is not None or wait_s <= 0:
            if claim is None:
                self.claim_stats["lost"] += 1
            return claim
        self.claim_stats["lost"] += 1
        t0 = time.monotonic()
        attempt = 0
        try:
            while True:
                time.sleep(_backoff(attempt))
                attempt += 1
                hit = self.get(key, counted)
                if hit is not None:
                    return hit
                claim = self._claim_fresh(key)
                if isinstance(claim, tuple):
                    return claim
                if claim is not None:
                    self.claim_stats["won"] -= 1  # counted as lost already; it is a takeover
                    self.claim_stats["taken_over"] = self.claim_stats.get("taken_over", 0) + 1
                    return claim
                if time.monotonic() - t0 >= wait_s:
                    return None
        finally:
            self.claim_stats["wait_s"] += time.monotonic() - t0

    def _claim_fresh(self, key: str) -> ChainClaim | tuple[Entry, str] | None:
        """A claim, then the caches asked again: its last holder may have published and released
        between this process's miss and its claim. The entry then, the claim released."""
        claim = self.claim(key)
        if claim is None:
            return None
        hit = self.get(key, counted=False)
        if hit is None:
            return claim
        self.release(claim)
        self.claim_stats["won"] -= 1
        return hit

    def renewing(self, claim: ChainClaim | None, every_s: float | None = None) -> "_Renewal":
        """A context manager: a thread renews `claim` every lease/4 while the body compiles."""
        return _Renewal(self, claim, every_s if every_s is not None else max(0.05, self.lease_s / 4))


class _Renewal:
    def __init__(self, chain: CacheChain, claim: ChainClaim | None, every_s: float) -> None:
        self.chain, self.claim, self.every_s = chain, claim, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "_Renewal":
        if self.claim is not None and self.chain.shared is not None:
            self._thread = threading.Thread(target=self._run, name="proteus-claim-renewal", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.chain.renew(self.claim)
            except Exception:  # noqa: BLE001  a renewal that fails: the lease may break the claim
                pass

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def make_chain(use_stored_cache: bool = True, directory: str | None = None, max_mb: float = 1024,
               shared=None) -> CacheChain:
    """`shared`: a tier (open_shared) after the node-local directory, or None."""
    levels: list = [MemoryCache()]
    if use_stored_cache:
        levels.append(StorageCache(directory, max_mb))
    return CacheChain(levels, shared)
