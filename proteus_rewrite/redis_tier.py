"""The shared cache tier on Redis or Valkey: PROTEUS_CACHE_SHARED=redis://[[user]:password@]host[:port][/db],
rediss://... (TLS), or a unix socket, redis+unix:///path/to/sock?db=N (or unix://...).

One key space for a whole job or site, so that one process per key compiles:

    proteus:e:<key>   an entry (or a tombstone: an entry of the tombstone kind), cache.encode(entry, secret)
                      bytes, published once with SET NX: a second put of the key changes nothing
    proteus:c:<key>   a claim: SET NX PX <lease> of a random token; renewed (PEXPIRE) and released (DEL)
                      by Lua scripts that act only while the value is still the caller's token

A get verifies the bytes with cache.decode(raw, key, secret): damaged bytes, another key's, or (with a secret)
a missing or wrong HMAC are a miss, counted, and the caller compiles again; its put then replaces the refused
value (compare-and-set on the bytes that were refused), since SET NX alone would keep it for ever.

Nothing here evicts: trim() is a no-op and Redis's own maxmemory policy (allkeys-lru, say) keeps the server's
size; an entry has no expiry of its own.

Faults: every command has short socket timeouts (CONNECT_TIMEOUT_S, OP_TIMEOUT_S) and no retries, so a dead or
frozen server costs one timeout at most. The first connection or timeout error logs one warning per process and
turns the tier off for the rest of the process: get is a miss, put raises CacheError (which CacheChain counts),
claim hands out a local claim (the process compiles by itself) and the run goes on on the local tiers.

The redis Python package (redis-py, `pip install proteus-rewrite[redis]`) is imported only by RedisTier().
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from urllib.parse import parse_qs, unquote, urlsplit

from . import cache
from .cache import DEFAULT_LEASE_S, Claim
from .errors import CacheError

log = logging.getLogger("proteus_rewrite")

ENTRY_PREFIX = "proteus:e:"
CLAIM_PREFIX = "proteus:c:"
CONNECT_TIMEOUT_S = 0.5
OP_TIMEOUT_S = 2.0
DEFAULT_PORT = 6379
LOCAL_TOKEN = "local:"  # a claim handed out while the server is unreachable: never sent to it
ENV = "PROTEUS_CACHE_SHARED"
NOT_INSTALLED = "the redis Python package is not installed (pip install proteus-rewrite[redis])"

# KEYS[1] the claim; ARGV[1] the token; ARGV[2] the lease in ms
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
# KEYS[1] the entry; ARGV[1] the bytes a get refused; ARGV[2] the replacement
REPLACE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2])
    return 1
end
return 0
"""

_warned = False  # one warning per process, whichever tier instance or thread fails first
_warn_lock = threading.Lock()


def parse_url(url: str) -> dict:
    """redis-py's connection arguments for a redis://, rediss://, redis+unix:// or unix:// URL; ValueError with
    a one-line reason for anything else."""
    try:
        u = urlsplit(url.strip())
        scheme = u.scheme.lower()
        query = parse_qs(u.query, keep_blank_values=True, strict_parsing=bool(u.query))
        host, port = u.hostname, u.port  # port: ValueError when not a number in 0..65535
    except ValueError as exc:
        raise ValueError(f"malformed URL ({exc})") from None
    unknown = set(query) - {"db"}
    if unknown:
        raise ValueError(f"unknown URL parameter {sorted(unknown)[0]!r} (only db=N)")
    args: dict = {}
    if u.username:
        args["username"] = unquote(u.username)
    if u.password is not None:
        args["password"] = unquote(u.password)
    db_text = None
    if "db" in query:
        if len(query["db"]) != 1:
            raise ValueError("db= given more than once")
        db_text = query["db"][0]
    if scheme in ("redis", "rediss"):
        if not host:
            raise ValueError("no host (redis://host[:port][/db])")
        if port == 0:
            raise ValueError("port 0")
        path = u.path.strip("/")
        if path and db_text is not None:
            raise ValueError("the database given twice (path and db=)")
        db_text = path or db_text
        args.update(host=host, port=port or DEFAULT_PORT)
        if scheme == "rediss":
            args["ssl"] = True
    elif scheme in ("redis+unix", "unix"):
        if u.netloc.rpartition("@")[2] not in ("", "localhost"):
            raise ValueError(f"a unix socket URL names no host ({scheme}:///path/to/socket?db=N)")
        if not u.path or u.path == "/":
            raise ValueError(f"no socket path ({scheme}:///path/to/socket?db=N)")
        args["unix_socket_path"] = unquote(u.path)
    else:
        raise ValueError(f"unsupported scheme {u.scheme + ':' if u.scheme else '(none)'} (redis://, rediss://, redis+unix://, unix://)")
    if db_text is not None:
        if not db_text.isdigit():
            raise ValueError(f"database {db_text!r} is not a number")
        args["db"] = int(db_text)
    else:
        args["db"] = 0
    return args


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        u = urlsplit(url)
        if u.password is None:
            return url
        user = u.username or ""
        netloc = f"{user}:***@{u.netloc.rpartition('@')[2]}"
        return u._replace(netloc=netloc).geturl()
    except ValueError:
        return "<malformed URL>"


class RedisTier:
    """A shared cache tier on one Redis (or Valkey) database; see the module's docstring."""

    name = "redis"

    def __init__(self, url: str, secret: bytes | None = None, umask: int | None = None, lease_s: float = DEFAULT_LEASE_S) -> None:
        """umask: open_shared's, for file:// tiers; nothing here (no files). lease_s: a claim's lease when claim()
        is given none (CacheChain.lease_s reads it)."""
        try:
            args = parse_url(url)
        except ValueError as exc:
            raise CacheError(f"{ENV}={redact(url)}: {exc}") from None
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise CacheError(NOT_INSTALLED) from None
        self._redis = redis
        self.url = redact(url)
        self.secret = secret
        self.lease_s = lease_s
        self.stats = cache.LevelStats()
        self.dead = False  # set by the first connection or timeout error: the tier is off from then on
        self._leases: dict[str, int] = {}  # claim token -> lease in ms, for renew
        self._refused: dict[str, bytes] = {}  # key -> the bytes a get refused: the next put of the key replaces them
        # no retries: a retried command on a dead server multiplies the time the app waits
        self._client = redis.Redis(
            **args,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=OP_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._renew = self._client.register_script(RENEW_LUA)
        self._release = self._client.register_script(RELEASE_LUA)
        self._replace = self._client.register_script(REPLACE_LUA)

    # --- faults

    def _down(self, exc: BaseException) -> None:
        """The server is unreachable, or stopped answering: off for the rest of this process, one warning."""
        global _warned
        self.dead = True
        with _warn_lock:
            first, _warned = not _warned, True
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if first:
            log.warning(
                "shared cache %s is unreachable (%s): off for the rest of this process, which compiles what it misses itself",
                self.url,
                reason,
            )
        else:
            log.debug("shared cache %s: %s", self.url, reason)

    def _faults(self) -> tuple[type[BaseException], ...]:
        r = self._redis.exceptions
        return (r.ConnectionError, r.TimeoutError, OSError)

    def _dead_error(self) -> CacheError:
        exc = CacheError(f"shared cache {self.url} is unreachable: entries are kept only locally")
        exc.quiet = True  # already warned about, once, by _down
        return exc

    # --- entries

    def get(self, key: str, counted: bool = True) -> cache.Entry | None:
        """counted=False: a lookup the report's hit and miss counts leave out (not a kernel's)."""
        stats = self.stats if counted else cache.LevelStats()
        if self.dead:
            stats.misses += 1
            return None
        try:
            raw = self._client.get(ENTRY_PREFIX + key)
        except self._faults() as exc:
            self._down(exc)
            stats.misses += 1
            return None
        except self._redis.exceptions.RedisError as exc:
            log.debug("shared cache %s: get %s: %s", self.url, key, exc)
            stats.misses += 1
            return None
        if raw is None:
            stats.misses += 1
            return None
        entry, why = cache.decode_checked(raw, key, self.secret)
        if entry is None:
            stats.misses += 1
            if why == "unsigned":
                self.stats.refused += 1
            else:
                self.stats.corrupt += 1
            if len(self._refused) >= 64:
                self._refused.clear()
            self._refused[key] = raw  # the caller compiles again: its put replaces these bytes
            log.warning(
                "shared cache %s: entry %s %s: not loaded, compiled again",
                self.url,
                key[:16],
                "has no valid HMAC" if why == "unsigned" else "is damaged",
            )
            return None
        stats.hits += 1
        return entry

    def put(self, entry: cache.Entry, enforce_cap: bool = True) -> None:
        """Publish the entry once (SET NX); a key already there is kept, unless it is bytes a get of this tier
        refused (damaged, unsigned), which are replaced. enforce_cap: no meaning here (Redis evicts)."""
        if self.dead:
            self.stats.write_failures += 1
            raise self._dead_error()
        data = cache.encode(entry, self.secret)
        name = ENTRY_PREFIX + entry.key
        try:
            if not self._client.set(name, data, nx=True):
                refused = self._refused.pop(entry.key, None)
                if refused is None:
                    return  # published by another process: the first one stays
                self._replace(keys=[name], args=[refused, data])
        except self._faults() as exc:
            self._down(exc)
            self.stats.write_failures += 1
            raise self._dead_error() from None
        except self._redis.exceptions.RedisError as exc:  # OOM (maxmemory noeviction), READONLY replica, ...
            self.stats.write_failures += 1
            raise CacheError(f"shared cache {self.url}: cannot store an entry: {str(exc).splitlines()[0]}") from None
        self.stats.puts += 1

    def tombstone(self, key: str, arch, reason: str) -> None:
        """Publish "this key does not compile" for every process: an entry of the tombstone kind, stored like any
        entry (publish once; never over a real entry). A failure is logged, never raised."""
        try:
            self.put(cache.tombstone_entry(key, arch, reason))
        except CacheError as exc:
            if not getattr(exc, "quiet", False):
                log.warning("%s", exc)

    def trim(self, max_mb: float) -> int:
        """Nothing: the server's maxmemory policy evicts (set maxmemory-policy allkeys-lru on a cache server)."""
        return 0

    # --- claims

    def _local_claim(self, key: str) -> Claim:
        return Claim(key, LOCAL_TOKEN + secrets.token_hex(8), self.name, time.time())

    def claim(self, key: str, lease_s: float | None = None) -> Claim | None:
        """The claim to compile key for lease_s seconds (renew to keep it), or None while another process holds
        a live one. With the server unreachable, a local claim: this process compiles by itself."""
        if self.dead:
            return self._local_claim(key)
        token = f"{os.getpid()}:{secrets.token_hex(12)}"
        lease_ms = max(1, int((self.lease_s if lease_s is None else lease_s) * 1000))
        try:
            won = self._client.set(CLAIM_PREFIX + key, token, nx=True, px=lease_ms)
        except (*self._faults(), self._redis.exceptions.RedisError) as exc:
            self._down(exc)
            return self._local_claim(key)
        if not won:
            return None
        self._leases[token] = lease_ms
        return Claim(key, token, self.name, time.time())

    def renew(self, claim: Claim) -> bool:
        """Extend the claim by its lease; False when it was lost (expired, and maybe taken by another process).
        A local claim, or any claim once the server is unreachable, stays this process's: True."""
        if claim.token.startswith(LOCAL_TOKEN) or self.dead:
            return True
        lease_ms = self._leases.get(claim.token)
        if lease_ms is None:
            return False  # released, or another tier's
        try:
            return bool(self._renew(keys=[CLAIM_PREFIX + claim.key], args=[claim.token, lease_ms]))
        except (*self._faults(), self._redis.exceptions.RedisError) as exc:
            self._down(exc)
            return True

    def release(self, claim: Claim) -> None:
        """Give the claim up (only if it is still ours): the next process that misses may claim the key."""
        self._leases.pop(claim.token, None)
        if claim.token.startswith(LOCAL_TOKEN) or self.dead:
            return
        try:
            self._release(keys=[CLAIM_PREFIX + claim.key], args=[claim.token])
        except (*self._faults(), self._redis.exceptions.RedisError) as exc:
            self._down(exc)
