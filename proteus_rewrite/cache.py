"""The code cache: levels behind one get/put interface, first level first.

    MemoryCache   level 1: this process's entries (a dict; the shim keeps its own C table in front)
    StorageCache  level 2: one file per entry under PROTEUS_CACHE_DIR (default: the user's XDG
                  cache directory, proteus-rewrite/jit), shared by every process and run

An entry file (`<key>.pjc`) is written to a temporary file in the same directory and renamed
into place, so a reader sees a whole entry or none, whatever other processes do. Its layout:

    magic b"PRJITC01" | u32 meta length | u32 0 | u64 payload length | 32-byte SHA-256 of
    meta + payload | meta (UTF-8 JSON) | payload (cubin or PTX)

A read verifies the checksum; a damaged entry is deleted and reported as a miss, so it is
rebuilt, never loaded. The directory is kept under PROTEUS_CACHE_MAX_MB by deleting the
least recently used entries (a hit refreshes an entry's modification time); its total size is
kept in `.usage`, updated by every put under the directory's `.lock` (on a file system
without file locks, unlocked and counted afresh on every put: `_flock`).

    SharedFileTier level 3 (optional): a directory many nodes share (`file:///shared/dir`,
                  or a Redis server, proteus_rewrite.redis_tier), named by PROTEUS_CACHE_SHARED
                  and opened by `open_shared`. A hit there fills the earlier levels.

The tier interface (duck-typed; MemoryCache, StorageCache, SharedFileTier and redis_tier's
RedisTier implement it, CacheChain calls nothing else):

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

Entries may carry an HMAC-SHA256 over meta + payload (`encode(entry, secret)`): a tier given a
secret refuses entries without a valid one (a miss, counted in stats.refused).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import hmac
import json
import logging
import os
import random
import socket
import struct
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from . import faults
from .errors import CacheError

log = logging.getLogger("proteus_rewrite")

MAGIC = b"PRJITC01"
HEADER = struct.Struct("<8sIIQ32s")
SUFFIX = ".pjc"
USAGE = ".usage"  # the entries' total size in bytes, kept by every put under LOCK
LOCK = ".lock"
RECOUNT_EVERY = 1024  # puts of one process between full recounts of USAGE
TOMBSTONE = "tombstone"  # an Entry kind: the variant failed (meta "reason"); nobody retries it
FLAG_HMAC = 1  # header's flags word: a 32-byte HMAC-SHA256 of meta + payload follows the payload
DEFAULT_LEASE_S = 30.0
QUARANTINE_AGE_S = 600.0  # a damaged shared entry younger than this may be mid-publish: left alone
CLAIMS = ".claims"  # the node-local tier's claim files


@dataclass(frozen=True)
class Entry:
    key: str
    kind: str  # "cubin", "ptx" or "codeobj" (an AMDGPU code object)
    arch: int | str  # SM version (90) or AMDGPU processor ("gfx90a")
    data: bytes = field(repr=False)
    meta: dict = field(default_factory=dict, compare=False)


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


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("proteus-rewrite")) / "jit"


class _NodeClaims:
    """StorageCache's claims: `<dir>/.claims/<key>`, created with O_EXCL, holding the holder's
    boot id, pid and token. Broken when that process is dead (same boot: the pid; another boot
    id: a reboot, so dead). No lock: O_EXCL works without flock."""

    def claim(self, key: str, lease_s: float = DEFAULT_LEASE_S) -> Claim | None:
        d = self.dir / CLAIMS
        path = d / key
        token = _token()
        body = f"{_boot_id()} {os.getpid()} {token}\n".encode()
        for _ in range(3):
            try:
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                if not self._holder_dead(path):
                    return None
                self.broken += 1
                _unlink_if(path, lambda raw: raw is not None and self._dead(raw))
                continue
            except OSError as exc:  # a cache we cannot claim in: compile unclaimed (as before claims)
                log.debug("cache: cannot claim %s: %s", key, exc.strerror or exc)
                return Claim(key, token, self.name, time.time(), None)
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
            return Claim(key, token, self.name, time.time(), path)
        return None

    def _holder_dead(self, path: Path) -> bool:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return self._dead(raw)

    @staticmethod
    def _dead(raw: bytes) -> bool:
        try:
            boot, pid, _ = raw.decode().split()
            pid_n = int(pid)
        except ValueError:  # being written: alive
            return False
        if boot != _boot_id():
            return True
        try:
            os.kill(pid_n, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return _is_zombie(pid_n)

    def renew(self, claim: Claim) -> bool:
        if claim.handle is None:
            return True
        try:
            return claim.token.encode() in Path(claim.handle).read_bytes()
        except OSError:
            return False

    def release(self, claim: Claim) -> None:
        if claim.handle is not None:
            _unlink_if(Path(claim.handle), lambda raw: raw is not None and claim.token.encode() in raw)

    def tombstone(self, key: str, arch, reason: str) -> None:
        self.put(tombstone_entry(key, arch, reason), enforce_cap=False)

    def trim(self, max_mb: float) -> int:
        """Delete the least recently used entries down to max_mb; the number deleted."""
        n = trim_oldest(self.entries(), max_mb, self.stats)
        try:
            (self.dir / USAGE).unlink(missing_ok=True)  # counted afresh by the next put
        except OSError:
            pass
        return n


def _unlink_if(path: Path, test) -> bool:
    """Delete `path` if test(its bytes) holds: renamed aside first, so that a file another process
    created there meanwhile is put back rather than deleted."""
    try:
        raw = path.read_bytes()
    except OSError:
        return False
    if not test(raw):
        return False
    aside = path.with_name(f"{path.name}.gone-{_token()}")
    try:
        os.rename(path, aside)
    except OSError:
        return False
    try:
        moved = aside.read_bytes()
    except OSError:
        moved = None
    if moved != raw:  # someone else's, created between the read and the rename: back
        try:
            os.link(aside, path)
        except OSError:
            pass
    aside.unlink(missing_ok=True)
    return moved == raw


@functools.lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]



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

def tombstone_entry(key: str, arch, reason: str) -> Entry:
    return Entry(key, TOMBSTONE, arch, b"", {"reason": reason[:500], "host": socket.gethostname(), "pid": os.getpid(),
                                             "time": time.time()})


class StorageCache(_NodeClaims):
    name = "disk"

    def __init__(self, directory: str | os.PathLike | None = None, max_mb: float = 1024) -> None:
        self.dir = Path(directory) if directory else default_cache_dir()
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.stats = LevelStats()
        self._accounted = 0  # puts this process has added to USAGE
        self.broken = 0  # claims of dead processes this process broke

    def path(self, key: str) -> Path:
        return self.dir / f"{key}{SUFFIX}"

    def get(self, key: str, counted: bool = True) -> Entry | None:
        """counted=False: a lookup the report's hit and miss counts leave out (not a kernel's)."""
        p = self.path(key)
        stats = self.stats if counted else LevelStats()
        try:
            raw = p.read_bytes()
        except (FileNotFoundError, NotADirectoryError):  # a directory that is a file: the put says so
            stats.misses += 1
            return None
        except OSError as exc:
            log.warning("cache: cannot read %s: %s", p, exc.strerror or exc)
            stats.misses += 1
            return None
        entry = decode(raw, key)
        if entry is None:
            self.stats.corrupt += 1
            stats.misses += 1
            log.warning("cache entry %s is damaged: deleted, the kernel is compiled again", p)
            try:
                p.unlink(missing_ok=True)
            except OSError:  # a read-only cache: the entry stays, and is never loaded
                pass
            return None
        try:
            os.utime(p)  # least-recently-used order
        except OSError:
            pass
        stats.hits += 1
        return entry

    def put(self, entry: Entry, enforce_cap: bool = True) -> None:
        """Write the entry atomically and keep the directory under its cap. enforce_cap=False
        only renames it into place, for a tiny entry written where an app thread waits: no
        lock shared with other processes, and the next put's accounting absorbs it."""
        try:
            faults.check_cache_write()
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            data = encode(entry)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.dir)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                if enforce_cap:
                    self._place_and_account(tmp, self.path(entry.key), len(data))
                else:
                    os.replace(tmp, self.path(entry.key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            self.stats.write_failures += 1
            raise CacheError(f"cannot write a cache entry: {self._reason(exc)}", self.dir) from None
        self.stats.puts += 1

    def check_writable(self) -> None:
        """Raise the CacheError a put would, without storing anything: for a command that is about
        to compile for the cache (prewarm), which should not find out after compiling."""
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.dir)
            os.close(fd)
            os.unlink(tmp)
            lock = os.open(self.dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                _flock(lock)
            finally:
                os.close(lock)
        except OSError as exc:
            raise CacheError(f"cannot write a cache entry: {self._reason(exc)}", self.dir) from None

    def _reason(self, exc: OSError) -> str:
        # mkdir on a file says "File exists", which does not tell what to change
        if self.dir.exists() and not self.dir.is_dir():
            return "not a directory"
        return exc.strerror or str(exc)

    def entries(self) -> list[tuple[Path, os.stat_result]]:
        try:
            it = list(os.scandir(self.dir))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CacheError(f"cannot read the cache directory: {self._reason(exc)}", self.dir) from None
        out = []
        for de in it:
            if de.name.endswith(SUFFIX):
                try:
                    out.append((Path(de.path), de.stat()))
                except FileNotFoundError:  # evicted by another process meanwhile
                    pass
        return out

    def _place_and_account(self, tmp: str, target: Path, size: int) -> None:
        """Rename the entry into place and keep the directory's total in USAGE, both under the
        directory's lock, so that every process's puts add up exactly. Summing every entry's
        size instead takes 12 ms at 1,000 entries and 58 ms at 5,000 (docs/dev/findings/cache.md);
        it is done only without a usable USAGE, every RECOUNT_EVERY puts of this process (what
        the count misses: a damaged entry deleted on read, another tool's files) and to evict."""
        lock = os.open(self.dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            locked = _flock(lock)  # released with the descriptor, whatever happens
            try:
                replaced = os.stat(target).st_size
            except FileNotFoundError:
                replaced = 0
            os.replace(tmp, target)
            self._accounted += 1
            usage = os.open(self.dir / USAGE, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                total = _parse_usage(os.read(usage, 32))
                # unlocked, another process's put may land between the read and the write: count
                # every time, so that a lost update never outlives the next put
                if total is None or not locked or self._accounted % RECOUNT_EVERY == 0:
                    total = sum(st.st_size for _, st in self.entries())
                else:
                    total += size - replaced
                if total > self.max_bytes:
                    total = self._evict()
                text = str(total).encode()
                os.pwrite(usage, text, 0)
                os.ftruncate(usage, len(text))
            finally:
                os.close(usage)
        finally:
            os.close(lock)

    def _evict(self) -> int:
        """Delete least recently used entries down to 90% of the cap (some headroom, so that
        every put does not evict); the directory's lock is held. Returns the total left."""
        entries = sorted(self.entries(), key=lambda e: e[1].st_mtime)
        total = sum(st.st_size for _, st in entries)
        target = int(self.max_bytes * 0.9)
        for p, st in entries:
            if total <= target:
                break
            p.unlink(missing_ok=True)
            total -= st.st_size
            self.stats.evicted += 1
        return total

    def clear(self) -> int:
        n = 0
        try:
            for p, _ in self.entries():
                p.unlink(missing_ok=True)
                n += 1
            for tmp in self.dir.glob(".tmp-*") if self.dir.exists() else ():
                tmp.unlink(missing_ok=True)
            (self.dir / USAGE).unlink(missing_ok=True)
        except OSError as exc:
            done = f" ({n} removed)" if n else ""
            raise CacheError(f"cannot delete cache entries: {self._reason(exc)}{done}", self.dir) from None
        return n


# What flock answers on a file system that has no locks (some NFS and FUSE mounts): ENOLCK,
# ENOSYS, EOPNOTSUPP, or EINVAL for a descriptor it cannot lock.
NO_LOCKS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}


def _flock(fd: int) -> bool:
    """Lock the cache directory's lock file; False where the file system cannot, and the put
    goes on unlocked: an entry is still renamed into place whole, only the size total may
    race, and it is then counted again on each put."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno not in NO_LOCKS:
            raise
        log.debug("cache: no file locks here (%s): the entries' total is counted on each put", exc.strerror)
        return False
    return True


def _parse_usage(raw: bytes) -> int | None:
    try:
        total = int(raw.decode("ascii"))
    except ValueError:  # empty (new), or damaged: counted again
        return None
    return total if total >= 0 else None


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


def encode(entry: Entry, secret: bytes | None = None) -> bytes:
    """The entry's bytes; with a secret, an HMAC-SHA256 of meta + payload follows the payload
    (the header's flags say so)."""
    meta = dict(entry.meta, key=entry.key, kind=entry.kind, arch=entry.arch)
    meta_raw = json.dumps(meta, sort_keys=True).encode()
    digest = hashlib.sha256(meta_raw + entry.data).digest()
    flags = FLAG_HMAC if secret else 0
    out = HEADER.pack(MAGIC, len(meta_raw), flags, len(entry.data), digest) + meta_raw + entry.data
    if secret:
        out += hmac.new(secret, meta_raw + entry.data, hashlib.sha256).digest()
    return out


def decode(raw: bytes, key: str | None = None, secret: bytes | None = None) -> Entry | None:
    """The entry, or None if the bytes are not a whole, intact entry (for that key), or, with a
    secret, not signed with it."""
    return decode_checked(raw, key, secret)[0]


def decode_checked(raw: bytes, key: str | None = None, secret: bytes | None = None) -> tuple[Entry | None, str]:
    """decode, and why not: "" (decoded), "damaged", or "unsigned" (whole, but without a valid
    HMAC where a secret is configured)."""
    if len(raw) < HEADER.size:
        return None, "damaged"
    magic, meta_len, flags, payload_len, digest = HEADER.unpack_from(raw)
    mac_len = 32 if flags & FLAG_HMAC else 0
    if magic != MAGIC or flags & ~FLAG_HMAC or HEADER.size + meta_len + payload_len + mac_len != len(raw):
        return None, "damaged"
    body = raw[HEADER.size : len(raw) - mac_len]
    if hashlib.sha256(body).digest() != digest:
        return None, "damaged"
    try:
        meta = json.loads(body[:meta_len])
        arch = meta["arch"] if isinstance(meta["arch"], str) else int(meta["arch"])
        entry = Entry(meta["key"], meta["kind"], arch, bytes(body[meta_len:]), meta)
    except (ValueError, KeyError, TypeError):
        return None, "damaged"
    if key is not None and entry.key != key:
        return None, "damaged"
    if secret:
        mac = raw[len(raw) - mac_len:] if mac_len else b""
        if not mac_len or not hmac.compare_digest(mac, hmac.new(secret, body, hashlib.sha256).digest()):
            return None, "unsigned"
    return entry, ""


def describe(path: Path) -> dict:
    """For `proteus-rewrite cache ls`: an entry's metadata, or why it is unreadable."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return {"file": path.name, "error": exc.strerror or str(exc)}
    entry = decode(raw)
    if entry is None:
        return {"file": path.name, "error": "damaged"}
    st = path.stat()
    return {
        "key": entry.key,
        "kernel": entry.meta.get("kernel", "?"),
        "kind": entry.kind,
        "arch": entry.arch,
        "bytes": len(raw),
        "compile_ms": entry.meta.get("compile_ms"),
        "last_used": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime)),
    }
