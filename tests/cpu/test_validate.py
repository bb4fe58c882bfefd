"""PROTEUS_VALIDATE's run-time half (runtime/validate.py): the comparison, the verdicts, the
deny list in the cache directory and in the store, and the commands around it. The shim's half
(shim/cuda_validate.c) runs on the GPU: tests/gpu/test_validate.py."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct

import pytest

from proteus_rewrite import runtime, store
from proteus_rewrite.jit.launch import parse_value
from proteus_rewrite.runtime import protocol, validate

from ..conftest import run_cli
from ..support.launches import kernel, runtime_over


def f32(*xs):
    return struct.pack(f"<{len(xs)}f", *xs)


def f64(*xs):
    return struct.pack(f"<{len(xs)}d", *xs)


def test_compare_counts_bytes_and_reads_floats_in_ulps():
    assert validate.compare(f32(1.0, 2.0), f32(1.0, 2.0)) == (0, -1, 0.0, False)
    one_up = struct.unpack("<f", struct.pack("<I", struct.unpack("<I", f32(2.0))[0] + 1))[0]
    count, first, ulps, _ = validate.compare(f32(1.0, 2.0), f32(1.0, one_up))
    assert (count, first, ulps) == (1, 4, 1.0)
    # a double's last bit: 1 ULP as float64 (as float32 its low word would be far off)
    bits = struct.unpack("<Q", f64(3.0))[0]
    assert validate.compare(f64(3.0), struct.pack("<Q", bits + 3))[2] == 3.0
    assert validate.compare(f64(-0.0), f64(0.0))[:2] == (1, 7) and validate.compare(f64(-0.0), f64(0.0))[2] == 0.0
    assert math.isinf(validate.compare(f32(1.0), f32(float("nan")))[2])
    assert validate.compare(f32(float("nan")), f32(float("nan")))[:3] == (0, -1, 0.0)  # the same bits
    assert validate.compare(b"\x01\x02", b"\x01\x02\x03")[0] == 1  # lengths differ


@pytest.fixture
def state(samples, table, tmp_path, monkeypatch):
    """The run time initialized over loop_count's store, with axpy_loop as kernel 0, under
    PROTEUS_VALIDATE=1 (every variant checked; once_state has the default)."""
    assert run_cli(str(samples / "loop_count"), "-o", str(tmp_path / "out")).returncode == 0
    monkeypatch.setenv("PROTEUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PROTEUS_COMPILE_PROCESS", "0")
    monkeypatch.setenv("PROTEUS_VALIDATE", "1")
    yield runtime_over(tmp_path / "out", "axpy_loop")
    runtime.reset()


@pytest.fixture
def once_state(samples, tmp_path, monkeypatch):
    """The default (PROTEUS_VALIDATE unset): `again()` starts a run over the same cache."""
    assert run_cli(str(samples / "loop_count"), "-o", str(tmp_path / "out")).returncode == 0
    monkeypatch.setenv("PROTEUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PROTEUS_COMPILE_PROCESS", "0")
    monkeypatch.delenv("PROTEUS_VALIDATE", raising=False)

    def again():
        st, _t, k = runtime_over(tmp_path / "out", "axpy_loop")
        return st, k

    yield again
    runtime.reset()


def _asks_check(k, n: str) -> bool:
    answer = runtime.specialize(0, _args(k, {1: n}), (4, 1, 1), (256, 1, 1), b"", 90)
    return bool(protocol.split_image_answer(answer)[3] & protocol.IMAGE_CHECK)


def test_by_default_each_variant_is_checked_once_ever(once_state):
    """The default: a new variant's answer asks the shim to check it; once a run has found its
    results equal, later runs load it unchecked, and a variant that could not be compared is not
    tried again either. A difference denies the kernel, as in full mode."""
    st, k = once_state()
    assert validate.mode() == "once"
    assert _asks_check(k, "3") and _asks_check(k, "4") and _asks_check(k, "5")
    runtime.checked(0, 0, "same", _args(k, {1: "3"}), 2, 4096, 0.8)  # equal, on the GPU
    runtime.validate_skipped(0, 1, "its allocations hold 3000 MB, more than PROTEUS_VALIDATE_MAX_MB (2048)")
    assert [o.verdict for o in st.validation] == ["same", "skipped"]
    assert st.stats[0].variants[0]["check"] == {"verdict": "same"}
    assert st.stats[0].variants[1]["check"]["verdict"] == "unchecked"
    assert st.stats[0].variants[2]["check"] == {"verdict": "pending"}  # the run ended before its check
    st, k = once_state()
    assert not _asks_check(k, "3") and not _asks_check(k, "4")
    assert _asks_check(k, "5")


def test_by_default_an_uncheckable_variant_runs_and_is_not_warned_about(once_state, capfd):
    st, k = once_state()
    _asks_check(k, "3")
    assert runtime.validated(0, 0, _args(k, {1: "3"}), _ranges(8), f64(1.0), f64(2.0), f64(3.0), 1.0) == 2
    assert "its variant runs unchecked" in capfd.readouterr().err
    assert st.stats[0].variants[0]["check"]["verdict"] == "unchecked"


def test_an_original_that_varies_told_on_the_gpu_leaves_the_variant_unchecked(once_state, capfd):
    """The compare kernel found the original's own two runs different: nothing read back, the
    variant runs unchecked by default and is not tried again."""
    st, k = once_state()
    _asks_check(k, "3")
    runtime.checked(0, 0, "varies", _args(k, {1: "3"}), 1, 8, 0.4)
    assert st.validation[0].verdict == "varies" and "its two runs differ" in st.validation[0].reason
    assert "its variant runs unchecked" in capfd.readouterr().err
    assert b"varied from run to run" in runtime.validate_refusal(0)  # (the shim asks once a kernel: it marks it too)
    st, k = once_state()
    assert not _asks_check(k, "3")


def test_a_kernel_whose_original_varied_is_not_checked_again_by_default(once_state, monkeypatch):
    """A variant of a kernel whose original varied at a check can only end the same way: later
    runs do not run its other variants in the shadow (the shim reports them skipped, and they run
    unchecked). Full mode checks them anyway."""
    st, k = once_state()
    _asks_check(k, "3")
    runtime.checked(0, 0, "varies", _args(k, {1: "3"}), 1, 8, 0.4)
    st, k = once_state()
    assert _asks_check(k, "4")  # a new variant still asks; the shim asks why not, and skips it
    assert b"results varied from run to run at an earlier check" in runtime.validate_refusal(0)
    monkeypatch.setenv("PROTEUS_VALIDATE", "1")
    st, k = once_state()
    assert runtime.validate_refusal(0) == b""


def test_full_mode_checks_every_variant_every_run_and_off_checks_none(once_state, monkeypatch):
    st, k = once_state()
    _asks_check(k, "3")
    runtime.checked(0, 0, "same", _args(k, {1: "3"}), 1, 8, 0.1)
    monkeypatch.setenv("PROTEUS_VALIDATE", "1")
    st, k = once_state()
    assert _asks_check(k, "3")  # its stored verdict does not count
    monkeypatch.setenv("PROTEUS_VALIDATE", "0")
    st, k = once_state()
    assert not _asks_check(k, "4") and validate.mode() == "off"


def _args(k, values: dict[int, str]) -> bytes:
    return b"".join(parse_value(p, values[p.index]) if p.index in values else bytes(p.size) for p in k.params)


def _ranges(*sizes: int, read: tuple[int, ...] = ()) -> bytes:
    """Range descriptors; all read back unless `read` says which."""
    return b"".join(protocol.VALIDATE_RANGE.pack(0x7F0000000000 + 0x100000 * i, n, read[i] if read else 1)
                    for i, n in enumerate(sizes))


def test_equal_results_keep_the_variant(state):
    st, _t, k = state
    assert runtime.validated(0, 0, _args(k, {1: "3"}), _ranges(8), f64(1.0), f64(1.0), f64(1.0), 1.5) == 0
    assert st.validation[0].verdict == "same" and st.validation[0].allocations == 1
    assert validate.denied(st, k.name) is None


def test_a_difference_denies_the_kernel_now_and_in_later_runs(state, tmp_path, capfd):
    st, t, k = state
    assert runtime.validated(0, 0, _args(k, {1: "3"}), _ranges(8, 16), f64(1.0) + f64(0.0, 0.0),
                              f64(1.0) + f64(0.0, 5.0), b"", 2.0) == 1
    err = capfd.readouterr().err
    assert f"proteus: validation: {k.demangled}: its variant wrote different results" in err and "denied" in err
    outcome = st.validation[0]
    # 5.0 vs 0.0: the top bytes of the 2nd double
    assert outcome.verdict == "differs" and len(outcome.differences) == 1 and outcome.differences[0].first_offset == 14
    deny = validate.read_deny(tmp_path / "cache")
    assert k.name in deny and "'1': 3" in deny[k.name]["reason"].replace('"', "'")
    # this run: the miss path refuses the kernel, one warning, the original runs
    answer = runtime.specialize(0, _args(k, {1: "3"}), (1, 1, 1), (256, 1, 1), b"", 90)
    assert answer is None and any("denied by validation" in r for r in st.stats[0].failures)
    # a later run reads the list from the cache directory
    st.deny = None
    assert "different results" in validate.denied(st, k.name)["reason"]
    # and the report carries the outcome
    runtime.write_report(str(tmp_path / "r.json"), b"")
    v = json.loads((tmp_path / "r.json").read_text())["validation"]
    assert v[0]["verdict"] == "differs" and v[0]["differences"][0]["bytes_differing"] > 0


def test_ranges_the_gpu_found_equal_are_counted_but_not_sent(state, capfd):
    """Only the ranges where the GPU saw the variant's results differ come back: the others
    count among the allocations and bytes compared, and the offsets of the ones sent follow
    each other."""
    st, _t, k = state
    ranges = _ranges(8, 1 << 20, 16, read=(0, 0, 1))
    assert runtime.validated(0, 0, _args(k, {1: "3"}), ranges, f64(0.0, 5.0), f64(0.0, 0.0), b"", 2.0) == 1
    outcome = st.validation[0]
    assert outcome.allocations == 3 and outcome.bytes_compared == 8 + (1 << 20) + 16
    (d,) = outcome.differences
    assert d.base == 0x7F0000000000 + 0x200000 and d.size == 16 and d.first_offset == 14
    assert "in 1 of 3 allocations" in capfd.readouterr().err


class _Session:
    """What validate's deny list asks of a session: a cache directory, a chain, warn_once."""

    def __init__(self, cache_dir, chain=None) -> None:
        self.config = dataclasses.make_dataclass("C", [("cache_dir", str)])(str(cache_dir))
        self.cache, self.tables, self.deny, self.deny_checked, self.warned = chain, [], None, set(), []

    def warn_once(self, what: str, message: str) -> None:
        self.warned.append(message)


def _deny_at_once(cache_dir, name, barrier) -> None:
    barrier.wait()
    validate._persist(_Session(cache_dir), name, {"reason": f"{name} differs"})


def test_ranks_denying_at_once_lose_no_denial(tmp_path):
    """16 processes each deny a different kernel into one cache directory at the same moment:
    every denial is read back (a single list rewritten by each, read-modify-write, lost some)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    n = 16
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_deny_at_once, args=(tmp_path / "c", f"_Z6kernel{i}v", barrier)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    deny = validate.read_deny(tmp_path / "c")
    assert sorted(deny) == sorted(f"_Z6kernel{i}v" for i in range(n))
    assert not [f for f in (tmp_path / "c" / validate.DENY_DIR).iterdir() if f.name.startswith(".")]  # no temporaries


def test_an_old_deny_list_is_still_read_and_a_damaged_file_loses_only_itself(tmp_path):
    c = tmp_path / "c"
    c.mkdir()
    (c / validate.DENY_FILE).write_text(json.dumps({"tool": "proteus-rewrite", "denied": {"_Z3oldv": {"reason": "old"}}}))
    validate._persist(_Session(c), "_Z3newv", {"reason": "new"})
    assert set(validate.read_deny(c)) == {"_Z3oldv", "_Z3newv"}
    (c / validate.DENY_DIR / "0000.json").write_text('{"denied": ')  # another tool's half-written file
    st = _Session(c)
    assert validate.denied(st, "_Z3oldv")["reason"] == "old" and validate.denied(st, "_Z3newv")["reason"] == "new"
    assert len(st.warned) == 1 and "cannot read the validation deny list" in st.warned[0]


def test_a_denial_reaches_other_nodes_through_the_shared_tier(tmp_path):
    """Rank A denies on one node; rank B, with its own node-local directory and the same shared
    tier, finds the denial there (an entry of kind DENY_KIND)."""
    from proteus_rewrite.cache import make_chain
    from proteus_rewrite.tiers import open_shared

    def node(name):
        return _Session(tmp_path / name, make_chain(True, str(tmp_path / name), shared=open_shared(f"file://{tmp_path}/shared")))

    validate._persist(node("a"), "_Z4slowv", {"reason": "differs"})
    b = node("b")
    assert validate.read_deny(tmp_path / "b") == {}
    assert validate.denied(b, "_Z4slowv") == {"reason": "differs"} and validate.denied(b, "_Z5otherv") is None


def test_a_tolerance_in_ulps_accepts_small_float_differences(state, monkeypatch):
    st, _t, k = state
    # none: bit for bit, even where the numbers are equal
    assert runtime.validated(0, 0, _args(k, {}), _ranges(8), f64(-0.0), f64(0.0), b"", 1.0) == 1
    st.deny = {}
    bits = struct.unpack("<Q", f64(2.0))[0]
    monkeypatch.setenv("PROTEUS_VALIDATE_ULPS", "2")
    assert runtime.validated(0, 0, _args(k, {}), _ranges(8), struct.pack("<Q", bits + 2), f64(2.0), b"", 1.0) == 0
    assert st.validation[-1].verdict == "within-ulps"
    assert runtime.validated(0, 0, _args(k, {}), _ranges(8), struct.pack("<Q", bits + 3), f64(2.0), b"", 1.0) == 1


def test_an_original_whose_results_vary_is_reported_not_denied(state, tmp_path, capfd):
    """Two runs of the original on the same memory disagree (atomics, races): nothing to hold
    the variant to. This run keeps the original (2), the cache directory denies nothing."""
    st, _t, k = state
    assert runtime.validated(0, 0, _args(k, {1: "3"}), _ranges(8), f64(1.0), f64(2.0), f64(3.0), 1.0) == 2
    assert st.validation[0].verdict == "varies" and "vary from run to run" in st.validation[0].reason
    assert "not validated (the original kernel's own results vary" in capfd.readouterr().err
    assert validate.read_deny(tmp_path / "cache") == {} and validate.denied(st, k.name) is None


def test_kernels_that_print_are_not_run_in_the_shadow(state):
    st, t, k = state
    assert runtime.validate_refusal(0) == b""  # loop_count prints nothing on the GPU
    # the same module as if it called printf (CUDA's device printf is a call to vprintf)
    m = t.modules[k.module]
    printing = dataclasses.replace(t, modules=tuple(dataclasses.replace(x, code=x.code + b"vprintf") if x is m else x
                                                    for x in t.modules))
    st.kernels.append((printing, k))
    assert b"printf, which running it in the original's shadow would print twice" in runtime.validate_refusal(1)


def test_a_skipped_check_is_reported_once(state, capfd):
    st, _t, k = state
    runtime.validate_skipped(0, 0, "a cooperative launch, which validation does not repeat")
    runtime.validate_skipped(0, 0, "a cooperative launch, which validation does not repeat")
    assert capfd.readouterr().err.count("not validated (a cooperative launch") == 1
    assert [o.verdict for o in st.validation] == ["skipped", "skipped"]


def test_the_store_carries_the_deny_list(table, tmp_path):
    t = table("loop_count")
    k = kernel(t, "axpy_loop")
    denied = dataclasses.replace(t, denied={k.name: {"reason": "differs", "folded": {"1": 3}}})
    path = store.write(denied, tmp_path / "a.kstore")
    assert store.read(path).denied == denied.denied
    assert store.read(store.write(t, tmp_path / "b.kstore")).denied == {}


def test_validate_wants_a_rewritten_app(samples, tmp_path):
    p = run_cli("validate", str(samples / "loop_count"), "4")
    assert p.returncode == 3 and "not a rewritten app" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = run_cli(str(samples / "loop_count"), "-o", str(tmp_path), "extra")
    assert p.returncode == 2 and "they are the app's with --validate" in p.stderr


def test_the_wrong_code_fault_changes_the_last_folded_integer(table, monkeypatch):
    from proteus_rewrite.jit import Config, specialize

    from ..support.launches import launch_for

    t = table("annotated")
    k = kernel(t, "smooth")
    launch = launch_for(k, {1: "1024", 2: "7"})
    unoptimized = Config.from_env({"PROTEUS_OPT_LEVEL": "0"})  # the loop's bound stays a compare

    def compares():   # each compare's predicate and constant (its value's name left out)
        return [re.sub(r"%[\w.]+, ", "", line.split("icmp ")[1])
                for line in specialize(t, k, launch, unoptimized, keep_ir=True).ir_text.splitlines() if "icmp " in line]

    assert compares() == ["sge i32 1024", "slt i32 7"]
    monkeypatch.setenv("PROTEUS_FAULT_INJECT", "wrong-code")
    assert compares() == ["sge i32 1024", "slt i32 8"]  # passes, not n: no write out of bounds
