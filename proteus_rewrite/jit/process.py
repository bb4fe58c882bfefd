"""The run time's compiler, in a process of its own.

Inside the app, LLVM and nvJitLink cost more than their compilations: their ~130 MB of resident
library pages are torn down at every exit, a compile thread holds the GIL that the app's misses
wait for, and an LLVM assertion (llvmlite's build keeps them) would abort the app itself
(docs/dev/findings/compiler-process.md). Here a crash is one failed variant, and the app runs
the original kernel.

The app keeps everything else: the tracker, the caches, the keys. A request carries what
specializer.compile_variant takes (the kernel's record, its plan, the configuration, the
target) and the bitcode of modules that process has not seen yet; the answer carries the
image and the stage timings, or the error. Frames: a 4-byte little-endian length, then a
pickle: both ends are this package, over a socket pair only the two processes hold.

    python -m proteus_rewrite.jit.process [--nvjitlink PATH]
                                               the compiler's side: serves fd 0 until EOF, compiling
                                               with that libnvJitLink (the app's choice)
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from .. import faults, import_path
from ..errors import ProteusError, SpecializeError
from . import codegen

FRAME = struct.Struct("<I")
MAX_DEATHS = 3  # compiler processes that may die before this run stops compiling


# ---------------------------------------------------------------- the compiler's side


class _Modules:
    """Enough of a KernelTable for compile_variant: modules by index."""

    def __init__(self, modules: dict):
        self.modules = modules


def serve(sock: socket.socket) -> None:
    """Answer requests until the app closes its end (or goes away)."""
    from . import specializer

    known: dict[str, object] = {}  # module sha256 -> ModuleRecord
    try:
        _send(sock, {"id": 0})  # started: a death from here on is not a failure to start
    except OSError:
        return
    while True:
        try:
            msg = _receive(sock)
        except OSError:  # the app exited with our answer unread (a reset, not an EOF): the same end
            return
        if msg is None:
            return
        answer: dict = {"id": msg["id"]}
        try:
            os.environ["PROTEUS_FAULT_INJECT"] = msg.get("faults", "")  # tests: the app's, as it is now
            if msg["op"] == "warm_up":
                answer["ms"] = specializer.warm_up(msg["arch"], driver_version=msg["driver_version"], cg=msg["cg"])
            else:
                if faults.active("compiler-crash"):
                    os.kill(os.getpid(), signal.SIGKILL)
                known.update(msg["bitcode"])
                table = _Modules({i: known[sha] for i, sha in msg["modules"].items()})
                timings: dict[str, float] = {}
                answer.update(compiled=specializer.compile_variant(table, msg["kernel"], msg["plan"], msg["cg"], msg["arch"],
                                                                   msg["isa"], msg["keep_ir"], timings), timings=timings)
            answer["ok"] = True
            answer["nvjitlink"] = codegen.loaded_nvjitlink()
        except Exception as exc:
            answer.update(ok=False, error=str(exc) if isinstance(exc, ProteusError) else f"{type(exc).__name__}: {exc}")
        try:
            _send(sock, answer)
        except OSError:
            return


def _receive(sock: socket.socket):
    head = _read(sock, FRAME.size)
    if head is None:
        return None
    body = _read(sock, FRAME.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def _read(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def _send(sock: socket.socket, msg: dict) -> None:
    body = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    # MSG_NOSIGNAL: the app's embedded Python leaves SIGPIPE to the app (the shim starts it
    # without signal handlers), and a compiler process gone must not kill it
    sock.sendall(FRAME.pack(len(body)) + body, socket.MSG_NOSIGNAL)


# ---------------------------------------------------------------- the app's side


class _Worker:
    def __init__(self, proc: subprocess.Popen, sock: socket.socket):
        self.proc, self.sock = proc, sock
        self.pid = os.getpid()  # of the app process that started it (a fork's child must not share it)
        self.modules: set[str] = set()  # sha256 of the modules it has
        self.next_id = 0
        self.answered = 0
        self.last_id = 0  # of the latest answer read
        self.nvjitlink: str | None = None  # the library file it compiles with, once it says

    def post(self, msg: dict) -> None:
        """Send a request; its answer is read by the next call()."""
        self.next_id += 1
        msg["id"] = self.next_id
        msg["faults"] = os.environ.get("PROTEUS_FAULT_INJECT", "")
        _send(self.sock, msg)

    def call(self, msg: dict) -> dict:
        self.post(msg)
        return self.settle()

    def settle(self) -> dict:
        """Read answers up to the latest request's: one-way requests (the warm-up) come first."""
        while True:
            answer = _receive(self.sock)
            if answer is None:
                raise EOFError
            self.answered += 1
            self.last_id = answer["id"]
            self.nvjitlink = answer.get("nvjitlink") or self.nvjitlink
            if answer["id"] == self.next_id:
                return answer

    def died(self) -> str:
        self.sock.close()
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        if code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        if not self.answered:  # not even its first frame: it never started (its errors: stderr, with the trace on)
            how += (" before answering (PROTEUS_TRACE_OUTPUT=specialization shows its errors; "
                    "PROTEUS_COMPILE_PROCESS=0 compiles in the app)")
        return how


class Compilers:
    """Up to `limit` compiler processes (one per compile thread: PROTEUS_ASYNC_THREADS), each
    serving one request at a time; started on first need, or ahead by start()."""

    def __init__(self, python: str, limit: int = 1, quiet: bool = True):
        self.python, self.limit, self.quiet = python, max(1, limit), quiet
        self._idle: list[_Worker] = []
        self._count = 0
        self._deaths = 0
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self.started_ms: list[float] = []  # for the report: how long each start took on the caller's thread
        self.nvjitlink: str | None = None  # the libnvJitLink file the processes loaded

    def report(self) -> dict:
        return {"python": self.python, "processes_started": len(self.started_ms), "deaths": self._deaths,
                "start_ms": [round(ms, 2) for ms in self.started_ms], "nvjitlink": self.nvjitlink}

    def start(self, arch: int | str, cg, driver_version: int | None) -> None:
        """Start one process now and let it warm its compiler up by itself; returns at once."""
        worker = self._acquire()
        try:
            worker.post({"op": "warm_up", "arch": arch, "cg": cg, "driver_version": driver_version})
        except OSError:
            self._lost(worker)
            return
        self._release(worker)

    def ready(self) -> None:
        """Wait until a process has answered what it was sent (its warm-up). A compile thread
        waits here before it decides what to fold: a value tracker that stops folding a step
        counter meanwhile (a dozen launches) then gets the general variant compiled first, not
        the first launch's, which no launch asks for any more. A process gone is left to the
        compilation that follows, which reports it."""
        worker = self._acquire()
        try:
            if worker.last_id < worker.next_id:
                worker.settle()
        except (OSError, EOFError, pickle.UnpicklingError):
            self._lost(worker)
            return
        self._release(worker)

    def compile(self, table, kernel, plan, cg, arch, isa, keep_ir, timings):
        """specializer.compile_variant, in a compiler process."""
        worker = self._acquire()
        needed = {i: table.modules[i] for i in (kernel.module, *kernel.link_modules)}
        msg = {"op": "compile", "kernel": kernel, "plan": plan, "cg": cg, "arch": arch, "isa": isa, "keep_ir": keep_ir,
               "modules": {i: m.sha256 for i, m in needed.items()},
               "bitcode": {m.sha256: m for m in needed.values() if m.sha256 not in worker.modules}}
        t = time.perf_counter()
        try:
            answer = worker.call(msg)
        except (OSError, EOFError, pickle.UnpicklingError):
            raise SpecializeError(f"the compiler process {self._lost(worker)}") from None
        except BaseException:  # not its death (a request that would not pickle): its stream is in doubt all the same
            self._lost(worker, death=False)
            raise
        worker.modules.update(msg["bitcode"])
        self._release(worker)
        timings.update(answer.get("timings", {}))
        timings["process"] = (time.perf_counter() - t) * 1000.0 - sum(answer.get("timings", {}).values())
        if not answer["ok"]:
            raise SpecializeError(answer["error"])
        return answer["compiled"]

    def _acquire(self) -> _Worker:
        with self._cond:
            if os.getpid() != self._pid:  # a fork's child: its parent's processes are not its own
                self._pid, self._idle, self._count, self._deaths, self.started_ms = os.getpid(), [], 0, 0, []
            while True:
                if self._deaths >= MAX_DEATHS:
                    raise SpecializeError(f"{MAX_DEATHS} compiler processes died; this run compiles no more")
                if self._idle:
                    return self._idle.pop()
                if self._count < self.limit:
                    self._count += 1
                    break
                self._cond.wait()
        try:
            return self._spawn()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker) -> None:
        self.nvjitlink = worker.nvjitlink or self.nvjitlink
        with self._cond:
            if worker.pid == self._pid:
                self._idle.append(worker)
                self._cond.notify()

    def _lost(self, worker: _Worker, death: bool = True) -> str:
        if not death:
            worker.proc.kill()
        how = worker.died()
        with self._cond:
            if worker.pid == self._pid:
                self._count -= 1
                self._deaths += death
                self._cond.notify()
        return how

    def _spawn(self) -> _Worker:
        t = time.perf_counter()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = child_environment(os.environ, import_path())
        # -S: no site hooks (the shim's own interpreter skips them too: the recorded path has
        # every directory they add); fd 0 and 1 are its end of the socket pair. Without site
        # handling a venv's site-packages are on the path but not in site.getsitepackages(),
        # where cuda-pathfinder looks: the library this process located goes with it, by path.
        argv = [self.python, "-S", "-m", "proteus_rewrite.jit.process"]
        lib = codegen.locate_nvjitlink()
        if lib is not None:
            argv += ["--nvjitlink", lib.path]
        try:
            proc = subprocess.Popen(argv, stdin=theirs, stdout=theirs,
                                    stderr=subprocess.DEVNULL if self.quiet else None, env=env, close_fds=True)
        except OSError as exc:
            mine.close()
            raise SpecializeError(f"cannot start the compiler process ({self.python}: {exc.strerror or exc})") from None
        finally:
            theirs.close()
        self.started_ms.append((time.perf_counter() - t) * 1000.0)
        return _Worker(proc, mine)


def child_environment(environ, path: list[str]) -> dict[str, str]:
    """A compiler process's environment: the app's, without the shim in LD_PRELOAD (it would
    start in the compiler too), with this interpreter's module path, and no GPU: nvJitLink
    initializes the driver, which opens the GPU's device files in the compiler, and with the GPU
    held open by another process the app's own exit skips the driver's teardown; that cost goes
    to the compiler's exit, after the app's, where the next GPU process would meet it
    (docs/dev/findings/compiler-process.md). It compiles the same without a device."""
    env = dict(environ)
    env["CUDA_VISIBLE_DEVICES"] = ""
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if not os.path.basename(p).startswith("libproteus")]
    if preload:
        env["LD_PRELOAD"] = " ".join(preload)
    else:
        env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env


def python_executable(recorded: str | None = None) -> str | None:
    """The Python that runs compiler processes: the one proteus-rewrite recorded (shim's
    proteus-python.cfg), this process's own where it is a Python, or the interpreter beside
    the library the shim loaded (same version, so the same bytecode and extension modules)."""
    candidates = [recorded, sys.executable if os.path.basename(sys.executable or "").startswith("python") else None,
                  os.path.join(sys.base_prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--nvjitlink"] and len(argv) == 2:
        codegen.pin_nvjitlink(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the app; EOF ends this process
    with socket.socket(fileno=os.dup(0)) as sock:
        os.close(0)
        os.close(1)
        sys.stdout = sys.stderr  # nothing may write into the socket but frames
        serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
