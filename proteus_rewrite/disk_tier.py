"""The node-local tier, StorageCache: one file per entry under PROTEUS_CACHE_DIR (default: the
user's XDG cache directory, proteus-rewrite/jit), shared by every process and run of the node.

An entry file (`<key>.pjc`, cache_entry's layout) is written to a temporary file in the same
directory and renamed into place, so a reader sees a whole entry or none, whatever other
processes do. A read verifies the checksum; a damaged entry is deleted and reported as a miss,
so it is rebuilt, never loaded. The directory is kept under PROTEUS_CACHE_MAX_MB by deleting the
least recently used entries (a hit refreshes an entry's modification time); its total size is
kept in `.usage`, updated by every put under the directory's `.lock` (on a file system without
file locks, unlocked and counted afresh on every put: `_flock`). Claims are files under
`.claims/` (`_NodeClaims`).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import socket
import tempfile
import time
from pathlib import Path

from . import faults
from .cache_entry import SUFFIX, Entry, decode, encode, tombstone_entry
from .errors import CacheError
from .tier_interface import DEFAULT_LEASE_S, Claim, LevelStats, _alive, _token, log, trim_oldest

USAGE = ".usage"  # the entries' total size in bytes, kept by every put under LOCK
LOCK = ".lock"
RECOUNT_EVERY = 1024  # puts of one process between full recounts of USAGE
CLAIMS = ".claims"  # the node-local tier's claim files
# A hit moves its entry up the least-recently-used order only when its time there is older
# than this: a warm run's hits then read and write nothing else (a file's time is a write to
# the file system's metadata, per hit), and eviction still sees which entries a week's runs use.
TOUCH_AFTER_S = 3600


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
        return not _alive(pid_n)

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
            with open(p, "rb") as f:
                raw, used = f.read(), os.fstat(f.fileno()).st_mtime
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
        if time.time() - used > TOUCH_AFTER_S:
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
