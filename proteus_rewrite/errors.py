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


class CacheError(ProteusError):
    """The code cache could not be read or written."""

    exit_code = 10


class InjectError(ProteusError):
    """Building the shim or rewriting the executable failed."""

    exit_code = 11


class ValidationError(ProteusError):
    """Under validation, a variant wrote results the original kernel did not, or the app failed."""

    exit_code = 12


# What each exit code means, for --help and the README.
EXIT_CODES = {
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
}
