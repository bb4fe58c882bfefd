"""The shared tier PROTEUS_CACHE_SHARED names, chosen once from its URL: a directory many nodes
mount (file_tier.SharedFileTier) or a Redis server (redis_tier.RedisTier, imported only then)."""

from __future__ import annotations

import os

from .errors import CacheError
from .file_tier import SharedFileTier
from .tier_interface import DEFAULT_LEASE_S


def open_shared(url: str, secret: bytes | None = None, umask: int | None = None, lease_s: float = DEFAULT_LEASE_S):
    """The shared tier PROTEUS_CACHE_SHARED names: file:///dir (SharedFileTier) or redis:// /
    rediss:// (redis_tier.RedisTier, imported only then)."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise CacheError(f"a file:// shared cache names a local path (file:///dir), not host {parsed.netloc!r}", url)
        if not parsed.path:
            raise CacheError("a file:// shared cache needs a directory (file:///dir)", url)
        return SharedFileTier(unquote(parsed.path), secret, umask, lease_s)
    if parsed.scheme in ("redis", "rediss", "redis+unix", "unix"):
        try:  # only when named: the redis package is an optional extra
            from .redis_tier import RedisTier
        except ImportError as exc:
            raise CacheError(f"a redis:// shared cache needs the redis package ({exc})", url) from None
        return RedisTier(url, secret=secret, umask=umask, lease_s=lease_s)
    raise CacheError(f"unsupported shared cache URL scheme {parsed.scheme or '(none)'!r}: use file:// or redis://", url)


def shared_from_config(config):
    """The shared tier a Config names, or None. Reads the attributes jit/config.py gives it
    (cache_shared: the URL, cache_secret, cache_umask, cache_lease_s), where present; else
    PROTEUS_CACHE_SHARED alone."""
    url = getattr(config, "cache_shared", None)
    if url is None:
        url = os.environ.get("PROTEUS_CACHE_SHARED") or None
    if not url:
        return None
    secret = getattr(config, "cache_secret", None)
    if isinstance(secret, str):
        secret = secret.encode()
    return open_shared(url, secret, getattr(config, "cache_umask", None),
                       getattr(config, "cache_lease_s", None) or DEFAULT_LEASE_S)
