"""The shared tier on a file system many nodes mount (NFS, Lustre): `file:///shared/dir`.

What a job's ranks share through it, and how it stays safe without any lock, is in the class's
docstring; the tier interface it implements is tier_interface.py's.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from . import faults
from .cache_entry import SUFFIX, Entry, decode_checked, encode, tombstone_entry
from .errors import CacheError
from .tier_interface import DEFAULT_LEASE_S, QUARANTINE_AGE_S, Claim, LevelStats, _alive, _token, log, trim_oldest


class SharedFileTier:
    """A cache directory many nodes share (an NFS or Lustre mount): `file:///shared/dir`.

        entries/<key[:2]>/<key>.pjc    one file per entry, written to a unique temporary name
                                       in its shard and renamed into place
        claims/<key[:2]>/<key>         a symlink whose target names host:pid:token (symlink()
                                       is atomic on NFS, where O_EXCL was not always)
        claims/<key[:2]>/<key>.hb      the holder's heartbeat: rewritten by renew()
        quarantine/                    damaged entries older than QUARANTINE_AGE_S

    No lock, no metadata written on a hit, no eviction by clients (trim() is `cache trim`'s). A
    damaged entry is a miss; it is moved to quarantine only once it is old, since a young one
    may be another node's publish seen half-way. A claim is broken when the waiter has seen
    neither its target nor its heartbeat change for lease_s by its own monotonic clock (as
    ccache does on NFS), or at once when its holder is a dead process of this host.

    umask: None keeps entries private (0600 files, 0700 directories); 0o002 makes them a
    project group's (0664 files, 2775 directories: new ones inherit the directory's group)."""

    name = "shared"

    def __init__(self, directory: str | os.PathLike, secret: bytes | None = None, umask: int | None = None,
                 lease_s: float = DEFAULT_LEASE_S) -> None:
        self.dir = Path(directory)
        self.secret = secret
        self.umask = umask
        self.lease_s = lease_s
        self.stats = LevelStats()
        self.broken = 0
        self._seen: dict[str, tuple[object, float]] = {}  # key -> (what the claim looked like, since: monotonic)
        self._host = socket.gethostname()

    # ---- layout and modes
    def path(self, key: str) -> Path:
        return self.dir / "entries" / key[:2] / f"{key}{SUFFIX}"

    def _claim_path(self, key: str) -> Path:
        return self.dir / "claims" / key[:2] / key

    @property
    def file_mode(self) -> int:
        return 0o600 if self.umask is None else 0o666 & ~self.umask

    @property
    def dir_mode(self) -> int:
        return 0o700 if self.umask is None else (0o777 & ~self.umask) | 0o2000

    def _mkdir(self, d: Path) -> None:
        if d.is_dir():
            return
        if d.parent != d and not d.parent.is_dir():
            self._mkdir(d.parent)
        try:
            os.mkdir(d, self.dir_mode)
            os.chmod(d, self.dir_mode)  # past the process's umask (and setgid, which mkdir drops)
        except FileExistsError:
            pass

    # ---- entries
    def get(self, key: str, counted: bool = True) -> Entry | None:
        p = self.path(key)
        stats = self.stats if counted else LevelStats()
        try:
            raw = p.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            stats.misses += 1
            return None
        except OSError as exc:
            log.warning("cache: cannot read %s: %s", p, exc.strerror or exc)
            stats.misses += 1
            return None
        entry, why = decode_checked(raw, key, self.secret)
        if entry is None:
            stats.misses += 1
            if why == "unsigned":
                self.stats.refused += 1
                log.warning("shared cache entry %s has no valid HMAC: not loaded", p)
                return None
            self.stats.corrupt += 1
            self._quarantine(p)
            return None
        stats.hits += 1
        return entry

    def _quarantine(self, p: Path) -> None:
        try:
            age = time.time() - p.stat().st_mtime
        except OSError:
            return
        if age < QUARANTINE_AGE_S:  # maybe mid-publish on another node (NFS): a miss, nothing deleted
            return
        q = self.dir / "quarantine"
        try:
            self._mkdir(q)
            os.rename(p, q / f"{p.name}.{_token()[:8]}")
            self.stats.quarantined += 1
            log.warning("shared cache entry %s is damaged: moved to %s", p, q)
        except OSError:
            pass

    def put(self, entry: Entry, enforce_cap: bool = True) -> None:
        target = self.path(entry.key)
        try:
            faults.check_cache_write()
            self._mkdir(target.parent)
            data = encode(entry, self.secret)
            tmp = target.parent / f".tmp-{self._host}-{os.getpid()}-{_token()[:12]}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.file_mode)
            try:
                try:
                    os.fchmod(fd, self.file_mode)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)  # whole on the server before the rename publishes it
                finally:
                    os.close(fd)
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        except OSError as exc:
            self.stats.write_failures += 1
            raise CacheError(f"cannot write a shared cache entry: {exc.strerror or exc}", self.dir) from None
        self.stats.puts += 1

    def check_writable(self) -> None:
        try:
            self._mkdir(self.dir / "entries")
            probe = self.dir / "entries" / f".tmp-probe-{_token()[:12]}"
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.file_mode))
            probe.unlink()
        except OSError as exc:
            raise CacheError(f"cannot write a shared cache entry: {exc.strerror or exc}", self.dir) from None

    def tombstone(self, key: str, arch, reason: str) -> None:
        self.put(tombstone_entry(key, arch, reason))

    def entries(self) -> list[tuple[Path, os.stat_result]]:
        out = []
        root = self.dir / "entries"
        try:
            shards = list(os.scandir(root))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise CacheError(f"cannot read the shared cache: {exc.strerror or exc}", self.dir) from None
        for shard in shards:
            if not shard.is_dir():
                continue
            for de in os.scandir(shard.path):
                if de.name.endswith(SUFFIX):
                    try:
                        out.append((Path(de.path), de.stat()))
                    except FileNotFoundError:
                        pass
        return out

    def trim(self, max_mb: float) -> int:
        """Delete the oldest entries (by write time: hits write nothing) down to max_mb, and
        temporary files, quarantined entries and claims left by dead processes for a day."""
        n = trim_oldest(self.entries(), max_mb, self.stats)
        old = time.time() - 86400
        for sub in ("entries", "claims", "quarantine"):
            for dirpath, _, names in os.walk(self.dir / sub):
                for name in names:
                    if sub == "entries" and not name.startswith(".tmp-"):
                        continue
                    f = Path(dirpath) / name
                    try:
                        if f.lstat().st_mtime < old:
                            f.unlink()
                    except OSError:
                        pass
        return n

    # ---- claims
    def claim(self, key: str, lease_s: float | None = None) -> Claim | None:
        lease = self.lease_s if lease_s is None else lease_s
        path = self._claim_path(key)
        token = _token()
        target = f"{self._host}:{os.getpid()}:{token}"
        for _ in range(3):
            try:
                self._mkdir(path.parent)
                os.symlink(target, path)
            except FileExistsError:
                if not self._stale(key, path, lease):
                    return None
                self._break(key, path)
                continue
            except OSError as exc:  # no symlinks here: compile unclaimed, as before claims existed
                log.debug("shared cache: cannot claim %s: %s", key, exc.strerror or exc)
                return Claim(key, token, self.name, time.time(), None)
            self._seen.pop(key, None)
            claim = Claim(key, token, self.name, time.time(), path)
            self.renew(claim)
            return claim
        return None

    def _stale(self, key: str, path: Path, lease: float) -> bool:
        try:
            target = os.readlink(path)
        except FileNotFoundError:
            return True  # released meanwhile: try again
        except OSError:
            return False
        host, _, rest = target.partition(":")
        pid = rest.partition(":")[0]
        if host == self._host and pid.isdigit() and not _alive(int(pid)):
            self._seen.pop(key, None)
            return True
        try:
            hb = Path(f"{path}.hb").read_bytes()
        except OSError:
            hb = b""
        state = (target, hb)
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is None or seen[0] != state:
            self._seen[key] = (state, now)
            return False
        if now - seen[1] >= lease:
            self._seen.pop(key, None)
            return True
        return False

    def _break(self, key: str, path: Path) -> None:
        try:
            target = os.readlink(path)
        except OSError:
            return
        aside = path.with_name(f"{path.name}.broken-{_token()[:12]}")
        try:
            os.rename(path, aside)
        except OSError:
            return
        try:
            moved = os.readlink(aside)
        except OSError:
            moved = None
        if moved != target and moved is not None:  # a new holder's, taken meanwhile: put back
            try:
                os.symlink(moved, path)
            except OSError:
                pass
        else:
            self.broken += 1
            log.info("shared cache: broke the claim on %s held by %s", key[:16], target)
        aside.unlink(missing_ok=True)

    def renew(self, claim: Claim) -> bool:
        if claim.handle is None:
            return True
        path = Path(claim.handle)
        try:
            if os.readlink(path).rpartition(":")[2] != claim.token:
                return False
            hb = path.with_name(f"{path.name}.hb")
            tmp = path.with_name(f"{path.name}.hb-{_token()[:12]}")
            tmp.write_bytes(f"{claim.token} {time.time():.3f} {_token()[:8]}".encode())
            os.replace(tmp, hb)
            return True
        except OSError:
            return False

    def release(self, claim: Claim) -> None:
        if claim.handle is None:
            return
        path = Path(claim.handle)
        try:
            if os.readlink(path).rpartition(":")[2] != claim.token:
                return  # broken and taken by another: theirs
            aside = path.with_name(f"{path.name}.done-{_token()[:12]}")
            os.rename(path, aside)
            if os.readlink(aside).rpartition(":")[2] != claim.token:  # replaced in between: back
                try:
                    os.symlink(os.readlink(aside), path)
                except OSError:
                    pass
            aside.unlink(missing_ok=True)
            path.with_name(f"{path.name}.hb").unlink(missing_ok=True)
        except OSError:
            pass
