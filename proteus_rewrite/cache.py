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
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import struct
import tempfile
import time
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


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("proteus-rewrite")) / "jit"


class StorageCache:
    name = "disk"

    def __init__(self, directory: str | os.PathLike | None = None, max_mb: float = 1024) -> None:
        self.dir = Path(directory) if directory else default_cache_dir()
        self.max_bytes = int(max_mb * 1024 * 1024)
        self.stats = LevelStats()
        self._accounted = 0  # puts this process has added to USAGE

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


class CacheChain:
    """Levels in order; a hit in a later level is copied into the earlier ones."""

    def __init__(self, levels: list) -> None:
        self.levels = levels
        self.put_errors: dict[str, int] = {}  # each put failure's message: how many times

    def get(self, key: str, counted: bool = True) -> tuple[Entry, str] | None:
        """counted=False: not a kernel's variant (a policy, a verdict): the levels' hit and miss
        counts, which the report and upstream's cache-stats lines show, leave it out."""
        for i, level in enumerate(self.levels):
            entry = level.get(key, counted)
            if entry is not None:
                for earlier in self.levels[:i]:
                    earlier.put(entry)
                return entry, level.name
        return None

    def put(self, entry: Entry, enforce_cap: bool = True) -> None:
        for level in self.levels:
            try:
                level.put(entry, enforce_cap)
            except CacheError as exc:  # a full or read-only disk must not stop the JIT
                if str(exc) not in self.put_errors:  # once: every later put fails alike
                    log.warning("%s", exc)
                self.put_errors[str(exc)] = self.put_errors.get(str(exc), 0) + 1

    def stats(self) -> dict[str, LevelStats]:
        return {level.name: level.stats for level in self.levels}


def make_chain(use_stored_cache: bool = True, directory: str | None = None, max_mb: float = 1024) -> CacheChain:
    levels: list = [MemoryCache()]
    if use_stored_cache:
        levels.append(StorageCache(directory, max_mb))
    return CacheChain(levels)


def encode(entry: Entry) -> bytes:
    meta = dict(entry.meta, key=entry.key, kind=entry.kind, arch=entry.arch)
    meta_raw = json.dumps(meta, sort_keys=True).encode()
    digest = hashlib.sha256(meta_raw + entry.data).digest()
    return HEADER.pack(MAGIC, len(meta_raw), 0, len(entry.data), digest) + meta_raw + entry.data


def decode(raw: bytes, key: str | None = None) -> Entry | None:
    """The entry, or None if the bytes are not a whole, intact entry (for that key)."""
    if len(raw) < HEADER.size:
        return None
    magic, meta_len, _, payload_len, digest = HEADER.unpack_from(raw)
    if magic != MAGIC or HEADER.size + meta_len + payload_len != len(raw):
        return None
    body = raw[HEADER.size :]
    if hashlib.sha256(body).digest() != digest:
        return None
    try:
        meta = json.loads(body[:meta_len])
        arch = meta["arch"] if isinstance(meta["arch"], str) else int(meta["arch"])
        entry = Entry(meta["key"], meta["kind"], arch, bytes(body[meta_len:]), meta)
    except (ValueError, KeyError, TypeError):
        return None
    if key is not None and entry.key != key:
        return None
    return entry


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
