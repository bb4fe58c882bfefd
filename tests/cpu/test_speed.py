"""Speed trials' run-time half (runtime/speed.py): which variants the shim is asked to time,
what its verdicts become (the report, the cache) and what a later run does with them. The
timing itself is the shim's (tests/shim/test_shim.c test_speed_trial) and the GPU's
(tests/gpu/test_speed.py)."""

from __future__ import annotations

import json

import pytest

from proteus_rewrite import runtime
from proteus_rewrite.jit.launch import parse_value
from proteus_rewrite.runtime import protocol, speed

from ..conftest import run_cli
from ..support.launches import runtime_over


@pytest.fixture
def state(samples, tmp_path, monkeypatch):
    """The run time over loop_count's store, axpy_loop as kernel 0; a fresh init per call of `again`."""
    assert run_cli(str(samples / "loop_count"), "-o", str(tmp_path / "out")).returncode == 0
    monkeypatch.setenv("PROTEUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PROTEUS_COMPILE_PROCESS", "0")
    monkeypatch.setenv("PROTEUS_VALIDATE", "0")  # the trials' flags alone (test_validate.py has the check's)

    def again():
        st, _t, k = runtime_over(tmp_path / "out", "axpy_loop")
        return st, k

    yield again
    runtime.reset()


def _args(k, values: dict[int, str]) -> bytes:
    return b"".join(parse_value(p, values[p.index]) if p.index in values else bytes(p.size) for p in k.params)


def _specialize(k, n: str) -> bytes | None:
    return runtime.specialize(0, _args(k, {1: n}), (4, 1, 1), (256, 1, 1), b"", 90)


def _trial(vid: int, verdict: str, original_us: float, variant_us: float, launches: int = 0) -> bytes:
    return protocol.pack_variant(0, vid, verdict, [original_us, original_us * 0.99, original_us * 1.01],
                                 [variant_us, variant_us * 0.99, variant_us * 1.01], launches)


def _asks_trial(answer: bytes) -> bool:
    return bool(protocol.split_image_answer(answer)[3] & protocol.IMAGE_TRIAL)


def test_a_new_variant_is_timed_and_a_slower_one_is_never_launched_again(state, tmp_path):
    st, k = state()
    answers = [protocol.split_image_answer(_specialize(k, n)) for n in ("3", "4", "5")]
    assert [(a[2], a[3]) for a in answers] == [(1, 1), (2, 1), (3, 1)]  # each asks for a trial, as its index + 1
    runtime.finish(b"", _trial(0, "kept", 100.0, 80.0) + _trial(1, "slower", 100.0, 130.0)
                   + protocol.pack_variant(0, 2, "undecided", [100.0, 101.0], [99.5]))
    v = st.stats[0].variants
    assert v[0]["speed"]["verdict"] == "kept" and v[0]["speed"]["variant_over_original"] == 0.8
    assert v[1]["speed"]["verdict"] == "slower" and v[1]["speed"]["variant_over_original"] == 1.3
    assert v[2]["speed"]["verdict"] == "undecided" and v[2]["speed"]["timed_launches"] == 3
    runtime.write_report(str(tmp_path / "r1.json"), b"")
    doc = json.loads((tmp_path / "r1.json").read_text())
    assert doc["kernels"] == []  # no counters passed: the kernels section comes from the shim's
    # the next run: the kept variant without a trial, the slower one not at all, the undecided one timed again
    st, k = state()
    kept = _specialize(k, "3")
    assert not _asks_trial(kept) and st.stats[0].variants[0]["speed"]["remembered"] is True
    assert _specialize(k, "4") is None
    assert st.stats[0].slower_declined[0]["speed"]["variant_median_us"] == 130.0
    assert st.stats[0].failures == {}  # a policy, not a failure: no warning
    assert _asks_trial(_specialize(k, "5"))


def test_the_report_shows_each_kernels_time_against_the_original(state, tmp_path):
    st, k = state()
    _specialize(k, "3")
    _specialize(k, "4")
    runtime.finish(b"", _trial(0, "kept", 100.0, 50.0) + _trial(1, "kept", 100.0, 200.0))
    counters = protocol.COUNTERS.pack(0, 40, 30, 2, 0, 0, 0, 6, 1000, 0, 0) + k.name.encode() + b"\0"
    runtime.write_report(str(tmp_path / "r.json"), counters)
    entry = json.loads((tmp_path / "r.json").read_text())["kernels"][0]
    assert entry["kernel_time_vs_original"] == 1.0  # the geometric mean of 0.5 and 2.0
    assert entry["launches_timing_original"] == 6 and entry["specialized_launches"] == 32
    out = run_cli("report", str(tmp_path / "r.json"))
    assert out.returncode == 0 and "time vs original" in out.stdout and "1.00x" in out.stdout
    assert "2 kept (0.50-2.00x)" in out.stdout


def test_the_report_says_in_words_what_the_trials_found_and_why_one_is_open(state, tmp_path):
    st, k = state()
    for n in ("3", "4", "5", "6"):
        _specialize(k, n)
    runtime.finish(b"", _trial(0, "kept", 100.0, 80.0) + _trial(1, "slower", 100.0, 130.0)
                   + protocol.pack_variant(0, 2, "undecided", [100.0, 101.0], [99.5])
                   + protocol.pack_variant(0, 3, "undecided", [], []))
    counters = protocol.COUNTERS.pack(0, 40, 30, 4, 0, 0, 0, 6, 1000, 0, 0) + k.name.encode() + b"\0"
    runtime.write_report(str(tmp_path / "r.json"), counters)
    rows = json.loads(run_cli("report", "--json", str(tmp_path / "r.json")).stdout)["kernels"]
    assert rows[0]["verdict"] == ("1 kept (0.80x); 1 slower, dropped; 1 not judged yet: 3 timed launches so far, "
                                  "later runs add theirs; 1 not timed: no launch ran it once it was ready")


def test_a_kernel_launched_once_a_run_is_judged_over_runs(state):
    """One launch a run: the first run times the variant, the next starts with the original and
    judges from the two (a long kernel needs one launch a side); the third runs it untimed."""
    st, k = state()
    trial_bits = protocol.IMAGE_TRIAL | protocol.IMAGE_ORIGINAL_FIRST
    flags = protocol.split_image_answer(_specialize(k, "3"))[3] & trial_bits
    assert flags == protocol.IMAGE_TRIAL  # the variant first
    runtime.finish(b"", protocol.pack_variant(0, 0, "undecided", [], [40_000.0]))
    assert st.stats[0].variants[0]["speed"]["verdict"] == "undecided"
    st, k = state()
    flags = protocol.split_image_answer(_specialize(k, "3"))[3] & trial_bits
    assert flags == protocol.IMAGE_TRIAL | protocol.IMAGE_ORIGINAL_FIRST  # the side the first run did not time
    runtime.finish(b"", protocol.pack_variant(0, 0, "undecided", [50_000.0], []))
    doc = st.stats[0].variants[0]["speed"]
    assert doc["verdict"] == "kept" and doc["judged_over_runs"] and doc["runs"] == 2 and doc["variant_over_original"] == 0.8
    st, k = state()
    assert not _asks_trial(_specialize(k, "3")) and st.stats[0].variants[0]["speed"]["remembered"]


@pytest.mark.parametrize(("original", "variant", "final", "verdict"), [
    ([2000.0], [1600.0], False, "kept"),  # a long kernel: one launch a side, apart
    ([2000.0], [2100.0], False, "slower"),
    ([2000.0], [2010.0], False, "undecided"),  # apart, but within the margin
    ([20.0], [10.0], False, "undecided"),  # a short kernel needs two a side
    ([20.0, 21.0], [10.0, 11.0], False, "kept"),
    ([60.0] * 6, [61.3] * 6, True, "slower"),  # 2% and 1.3 us: beyond margin and floor
    ([60.0] * 6, [60.5] * 6, True, "kept"),  # within the margin
    ([2.0] * 6, [2.8] * 6, True, "kept"),  # 40%, but under the 1 us floor
    ([60.0, 62.0, 60.0, 62.0, 60.0, 62.0], [61.9, 62.5, 61.5, 62.6, 61.8, 62.4], True, "slower"),
    ([60.0, 62.0, 60.0, 62.0, 60.0, 62.0], [60.5, 62.5, 61.5, 62.6, 61.8, 62.4], True, "kept"),  # one below the median
])
def test_judge_is_the_shims_rule(original, variant, final, verdict):
    assert speed.judge(original, variant, final) == verdict


def test_the_speed_check_can_be_turned_off(state, monkeypatch):
    monkeypatch.setenv("PROTEUS_SPEED_CHECK", "0")
    _st, k = state()
    assert not _asks_trial(_specialize(k, "3"))


def test_a_damaged_verdict_is_ignored(state):
    st, k = state()
    _specialize(k, "3")
    key = st.stats[0].variants[0]["cache_key"]
    from proteus_rewrite.cache import Entry

    st.cache.put(Entry(speed._key(key), speed.SPEED_KIND, 90, b"not json"))
    st, k = state()
    assert _asks_trial(_specialize(k, "3"))  # timed again


def test_cache_stats_prints_upstreams_line_per_variant_with_its_launches(state, monkeypatch, capfd):
    monkeypatch.setenv("PROTEUS_TRACE_OUTPUT", "cache-stats")
    st, k = state()
    _specialize(k, "3")
    _specialize(k, "4")
    counters = protocol.COUNTERS.pack(0, 12, 10, 0, 0, 0, 0, 0, 0, 0, 0) + k.name.encode() + b"\0"
    runtime.finish(counters, _trial(0, "undecided", 0, 0, launches=10) + _trial(1, "undecided", 0, 0, launches=2))
    out = capfd.readouterr().out
    h0, h1 = (int(st.stats[0].variants[i]["cache_key"][:16], 16) for i in (0, 1))
    assert "[proteus][JitEngineDevice] MemoryCache rank 0 hits 10 accesses 12" in out
    assert f"MemoryCache rank 0 HashValue {h0} NumExecs 10 NumHits 9" in out
    assert f"MemoryCache rank 0 HashValue {h1} NumExecs 2 NumHits 1" in out
    # the storage cache's accesses are the variants' lookups only: not the policy's, nor the verdicts'
    assert "[proteus][JitEngineDevice] StorageCache rank 0 hits 0 accesses 2" in out


class _WarmingCompiler:
    """A compiler process still warming up: compiles here, counts the waits for its warm-up."""

    def __init__(self):
        self.waits = 0

    def ready(self):
        self.waits += 1

    def compile(self, *args):
        from proteus_rewrite.jit.specializer import compile_variant
        return compile_variant(*args)


def test_a_cached_variant_does_not_wait_for_the_compilers_warm_up(state, monkeypatch):
    """PROTEUS_ASYNC_COMPILATION=0: the launching thread asks the caches before it waits for the
    compiler process's warm-up (on the H100 a warm run of adam waited 200-250 ms for it inside its
    timed loop); a variant that needs compiling waits for it, and is looked up once."""
    monkeypatch.setenv("PROTEUS_ASYNC_COMPILATION", "0")
    st, k = state()
    st.compiler = warming = _WarmingCompiler()
    assert _specialize(k, "7") and warming.waits == 1      # compiled: after the warm-up
    disk = st.cache.stats()["disk"]
    assert (disk.hits, disk.misses) == (0, 1)              # one lookup, not one per attempt
    st, k = state()                                        # the next run: the disk cache has it
    st.compiler = warming = _WarmingCompiler()
    assert _specialize(k, "7") and warming.waits == 0
    assert st.stats[0].disk_hits == 1
