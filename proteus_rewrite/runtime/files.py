"""Writing files so that a reader sees the old content or the new, never half of either: a
temporary file in the same directory, renamed into place. Every writer of the package uses it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes, mode: int | None = None) -> Path:
    """Write `data` to `path` atomically; `mode`: permission bits for the new file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
