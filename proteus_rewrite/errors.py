"""The one exception hierarchy of proteus-rewrite.

Every error a user can cause (a missing file, a binary without bitcode, a corrupt
fat binary) is a ProteusError. The CLI prints it as one line naming the file and
the reason and exits with the class's ``exit_code``; anything else is a bug.
"""

from __future__ import annotations

import os


class ProteusError(Exception):
    """Base class. ``path`` is the file the error is about, when there is one."""

    exit_code = 1

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        super().__init__(message)
        self.message = message
        self.path = os.fspath(path) if path is not None else None

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InputError(ProteusError):
    """The input file is missing, unreadable, or not a file at all."""

    exit_code = 3


class NotCudaBinaryError(ProteusError):
    """A readable file that is not an ELF with GPU code (no .nv_fatbin or .hip_fatbin)."""

    exit_code = 4


class FormatError(ProteusError):
    """A structure inside the binary is truncated or corrupt (ELF, fatbin, entry, cubin, PTX)."""

    exit_code = 5


class NoBitcodeError(ProteusError):
    """GPU code is present but no kernel carries LLVM bitcode (e.g. built by nvcc)."""

    exit_code = 6


class BitcodeError(ProteusError):
    """Embedded bitcode exists but LLVM cannot read it."""

    exit_code = 7


class StoreError(ProteusError):
    """The kernel store is missing, corrupt, of another version, or cannot be written."""

    exit_code = 8


class SpecializeError(ProteusError):
    """The JIT could not specialize or compile a kernel (the original kernel runs instead)."""

    exit_code = 9


class ConfigError(SpecializeError):
    """A PROTEUS_* variable holds a value it cannot take. A SpecializeError to the run time, which
    runs the app unspecialized with one error line; to the command line, a usage error."""

    exit_code = 2


class CacheError(ProteusError):
    """The code cache could not be read or written."""

    exit_code = 10


class InjectError(ProteusError):
    """Building the shim or rewriting the executable failed."""

    exit_code = 11


class ValidationError(ProteusError):
    """Under validation, a variant wrote results the original kernel did not, or the app failed."""

    exit_code = 12


class NoGpuError(ProteusError):
    """A command that runs the app (validate) found no usable GPU: the CUDA driver missing, or
    cuInit failing. Not ValidationError's code: nothing was compared, so nothing differed."""

    exit_code = 13


# Every code the command line exits with and what it means: for --help, docs/user/usage.md's
# table and the test that keeps the three the same.
USAGE = 2
EXIT_CODES = {
    0: "ok",
    1: "internal error, or prewarm: a variant failed",
    USAGE: "usage: a bad argument, option or PROTEUS_* value",
    InputError.exit_code: "input missing or unreadable",
    NotCudaBinaryError.exit_code: "not a GPU executable",
    FormatError.exit_code: "corrupt or truncated binary",
    NoBitcodeError.exit_code: "no embedded bitcode",
    BitcodeError.exit_code: "unreadable bitcode",
    StoreError.exit_code: "kernel store error",
    SpecializeError.exit_code: "specialization failed",
    CacheError.exit_code: "cache error",
    InjectError.exit_code: "shim or rewrite failed",
    ValidationError.exit_code: "validation found a difference",
    NoGpuError.exit_code: "no usable GPU to run the app on",
}
