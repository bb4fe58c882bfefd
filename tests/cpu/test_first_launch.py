"""A kernel's first launch in `auto` (runtime/first_launch.py): a miss that would queue the
kernel's first variant compiles it on the launching thread where the kernel's profile from an
earlier run says the wait pays, and queues it otherwise. The shim's side is unchanged: it loads
an image answer whatever the call asked (tests/shim)."""

from __future__ import annotations

import pytest

from proteus_rewrite import runtime
from proteus_rewrite.jit.launch import parse_value
from proteus_rewrite.runtime import first_launch, protocol

from ..conftest import run_cli
from ..support.launches import runtime_over


@pytest.fixture
def state(samples, tmp_path, monkeypatch):
    """The run time over loop_count's store, axpy_loop as kernel 0; a fresh init per call of `again`."""
    assert run_cli(str(samples / "loop_count"), "-o", str(tmp_path / "out")).returncode == 0
    monkeypatch.setenv("PROTEUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PROTEUS_COMPILE_PROCESS", "0")
    monkeypatch.setenv("PROTEUS_VALIDATE", "0")

    def again():
        st, _t, k = runtime_over(tmp_path / "out", "axpy_loop")
        return st, k

    yield again
    runtime.reset()


def _miss(k, n: str, cached_only: int = protocol.CACHED_ONLY) -> bytes | None:
    """A launch of axpy_loop with its count n, as the shim's miss in `auto` asks: the caches only."""
    args = b"".join(parse_value(p, n) if p.index == 1 else bytes(p.size) for p in k.params)
    return runtime.specialize(0, args, (4, 1, 1), (256, 1, 1), b"", 90, 0.0, cached_only)


def _counters(k, launches: int, gpu_ms: float) -> bytes:
    return protocol.COUNTERS.pack(0, launches, launches - 1, 1, 0, 0, 0, 0, int(gpu_ms * 1000), 0, 0) + k.name.encode() + b"\0"


def _trial(ratio: float) -> bytes:
    return protocol.pack_variant(0, 0, "kept" if ratio < 1 else "slower", [100.0, 99.0], [100.0 * ratio, 99.0 * ratio])


def _first_run(state, gpu_ms: float, ratio: float):
    """A run that compiles the kernel's variant on the launching thread (as with
    PROTEUS_ASYNC_COMPILATION=0), whose trial judged it `ratio` of the original's time, and whose
    kernel ran `gpu_ms` on the GPU; its profile is left in the cache."""
    st, k = state()
    assert _miss(k, "3", cached_only=0)
    runtime.finish(_counters(k, 10, gpu_ms), _trial(ratio))
    return st, k


def test_with_no_profile_the_first_miss_queues_its_variant(state):
    st, k = state()
    assert _miss(k, "3") == b""  # compile it on a compile thread: the original runs meanwhile
    assert st.stats[0].specializations == 0 and first_launch.load(st, 0) is None


def test_a_long_kernel_whose_variant_was_faster_waits_for_it_at_its_first_launch(state):
    st, _k = _first_run(state, gpu_ms=5000.0, ratio=0.5)
    profile = first_launch.load(st, 0)
    assert profile.launches == 10 and profile.gpu_ms == 5000.0 and profile.ratio == 0.5 and profile.compile_ms > 0
    # the next run, new inputs (a new key): its first miss compiles and answers the image
    st, k = state()
    answer = _miss(k, "7")
    assert answer and protocol.split_image_answer(answer)[1]
    assert st.stats[0].specializations == 1
    waited = st.stats[0].variants[0]["first_launch_waited"]
    assert waited["gain_ms"] == 2500.0 and waited["compile_ms"] == round(profile.compile_ms, 1)
    # only the first: another key of the kernel in this run is queued as before
    assert _miss(k, "8") == b""


@pytest.mark.parametrize("gpu_ms, ratio", [(5000.0, 1.3), (0.001, 0.5)])
def test_no_wait_where_the_variant_was_slower_or_the_kernel_too_short(state, gpu_ms, ratio):
    _first_run(state, gpu_ms=gpu_ms, ratio=ratio)
    st, k = state()
    assert _miss(k, "7") == b"" and st.stats[0].specializations == 0


def test_no_wait_in_mode_1_nor_for_a_launch_loaded_ahead(state, monkeypatch):
    _first_run(state, gpu_ms=5000.0, ratio=0.5)
    monkeypatch.setenv("PROTEUS_ASYNC_COMPILATION", "1")  # upstream's: never wait
    st, k = state()
    assert _miss(k, "7") == b""
    monkeypatch.setenv("PROTEUS_ASYNC_COMPILATION", "auto")
    st, k = state()
    assert _miss(k, "9", cached_only=protocol.CACHED_AHEAD) == b"" and st.stats[0].specializations == 0


def test_a_steady_app_writes_its_profile_once(state, monkeypatch):
    _first_run(state, gpu_ms=5000.0, ratio=0.5)
    st, k = state()
    assert _miss(k, "3", cached_only=0)  # its variant, from the disk cache
    puts = []
    real_put = st.cache.put
    monkeypatch.setattr(st.cache, "put", lambda entry, **kw: (puts.append(entry.kind), real_put(entry, **kw)))
    runtime.finish(_counters(k, 10, 5100.0), _trial(0.52))  # within 10% of the profile
    assert "profile" not in puts
    runtime.finish(_counters(k, 10, 9000.0), b"")  # its GPU time moved; the verdict is kept from before
    assert puts.count("profile") == 1
    profile = first_launch.load(st, 0)
    assert profile.gpu_ms == 9000.0 and profile.ratio == 0.5
