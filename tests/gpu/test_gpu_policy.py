"""The specialization policy on the GPU: value tracker, compile budget, asynchronous
compilation and prewarming, each checked against the native run's output."""

from __future__ import annotations

import json

import pytest

from ..conftest import run_cli
from ..support.apps import run_app

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def recorded(samples, tmp_path_factory):
    out = {}
    for app in ("changing_scalars", "loop_count", "multi_kernel", "device_globals"):
        d = tmp_path_factory.mktemp(app)
        assert run_cli(str(samples / app), "-o", str(d)).returncode == 0
        out[app] = d
    return out


def run(exe, args=(), **env):
    return run_app(exe, args, env)


def under_shim(recorded, app, tmp_path, **env):
    return {"LD_PRELOAD": str(recorded[app] / "libproteus.so"), "PROTEUS_CACHE_DIR": str(tmp_path / "cache"),
            "PROTEUS_REPORT": str(tmp_path / "report.json"), **env}


def kernel(tmp_path, name):
    doc = json.loads((tmp_path / "report.json").read_text())
    return next(k for k in doc["kernels"] if name in k["name"])


def test_a_step_counter_compiles_a_bounded_number_of_variants(samples, recorded, tmp_path):
    # k = launch index: a new value on every one of 1,000 launches; n and salt never change.
    # Every variant on the launching thread (upstream's synchronous mode), so every launch is specialized.
    args = ("1000", "1000", "1")
    native = run(samples / "changing_scalars", args)
    jit = run(samples / "changing_scalars", args,
              **under_shim(recorded, "changing_scalars", tmp_path, PROTEUS_ASYNC_COMPILATION="0"))
    assert jit.returncode == 0 and jit.stdout == native.stdout and "warning" not in jit.stderr, jit.stderr
    k = kernel(tmp_path, "accumulate_step")
    # the bound: T + 1 variants with the counter folded, then one that keeps it a parameter
    assert k["specializations"] == 8 + 2, k
    assert k["tracker"]["stopped_folding"] == ["2"]  # k (argument 2); n (1) and salt (3) stay folded
    assert k["tracker"]["folded_now"] == [1, 3]
    assert k["specialized_launches"] == 1000 and k["fallback_launches"] == 0
    assert k["gpu_ms_estimate"] > 0  # sampled with events


def test_by_default_a_step_counter_compiles_in_the_background(samples, recorded, tmp_path):
    """PROTEUS_ASYNC_COMPILATION=auto (the default): every variant compiles on a compile
    thread, the original kernel running meanwhile; a new value on every launch never asks for
    one variant twice in a row, so no launch waits for one, the tracker's learning included."""
    # 60,000 launches, about 1.5 s: the general variant lands well before the end (with 20,000,
    # 0.5 s, one run on the H100 ended before the compiler process had compiled it)
    args = ("60000", "20000", "1")
    native = run(samples / "changing_scalars", args)
    # one compile thread: the counts of misses and deferred launches below are its (with four,
    # the H100's default, a second thread takes the general variant while the first compiles)
    jit = run(samples / "changing_scalars", args, **under_shim(recorded, "changing_scalars", tmp_path, PROTEUS_ASYNC_THREADS="1"))
    assert jit.returncode == 0 and jit.stdout == native.stdout and "warning" not in jit.stderr, jit.stderr
    k = kernel(tmp_path, "accumulate_step")
    salt = 0x9E3779B9 - (1 << 32)  # an i32 to LLVM, as the report shows it
    assert 1 <= k["specializations"] <= 8 + 2
    assert k["tracker"]["stopped_folding"] == ["2"] and k["tracker"]["folded_now"] == [1, 3]
    assert k["launches_while_compiling"] > 0  # the original kernel ran while variants compiled
    doc = json.loads((tmp_path / "report.json").read_text())
    why = {f: doc.get(f) for f in ("prestart", "shim_wait_ms", "threads_ms", "timeline_ns")} | {
        "variants": [(v["source"], v["ms"], v["folded"]) for v in k["variants"]], "counts": {
            f: k[f] for f in ("launches", "specialized_launches", "fallback_launches", "launches_while_compiling")}}
    assert k["specialized_launches"] > 1 and k["specialized_launches"] + k["fallback_launches"] == 60000, why
    assert k["variants"][-1]["folded"] == {"1": 4096, "3": salt}  # the one that serves every k
    # the first launch queues a variant; while it is queued, the next T + 2 new values are kept
    # for the tracker (no Python call), and the miss after them passes them on: the counter
    # stops being folded there, and that miss queues the general variant
    waits = doc["shim_wait_ms"]
    assert doc["async_compilation"] == "auto" and (waits["miss_count"], waits["deferred_count"]) == (8 + 4, 8 + 2), waits
    t = doc["threads_ms"]  # the shim wraps main: its time, and the compile thread's CPU, are counted
    assert 0 < t["app_main_cpu"] <= t["app_main_wall"] + 1 and t["compile_threads_cpu"] > 0, t


def test_a_launch_that_repeats_while_the_gpu_is_busy_waits_for_its_variant(samples, recorded, tmp_path):
    """One value, 4,000 launches over 64M elements checked sparsely: the GPU's work dominates and
    the app queues launches ahead of it. The first launch runs the original while its variant
    compiles; the next ones ask for the same variant with the stream busy, so they wait for it
    rather than queue more of the original (rsbench's case)."""
    args = ("4000", "1", "1", str(1 << 26), "65536")
    native = run(samples / "changing_scalars", args)
    jit = run(samples / "changing_scalars", args, **under_shim(recorded, "changing_scalars", tmp_path))
    assert jit.returncode == 0 and jit.stdout == native.stdout and "warning" not in jit.stderr, jit.stderr
    k = kernel(tmp_path, "accumulate_step")
    assert k["specializations"] == 1 and k["launches_while_compiling"] >= 1
    # while it compiles each launch waits for the one before to finish, then runs the original:
    # the GPU never idles, and no backlog of originals builds up. The variant arrives once the
    # compiler process has started and compiled it: 0.2-0.3 s after the first launch on the H100
    # (944 and 975 of 2,000 launches ran specialized); this run lasts about 1 s. Without the
    # wait, the host would keep the driver's launch queue full of originals on top of those.
    assert k["specialized_launches"] + k["fallback_launches"] == 4000 and k["specialized_launches"] > 2000
    waits = json.loads((tmp_path / "report.json").read_text())["shim_wait_ms"]
    assert waits["compiling_count"] >= 1 and waits["compiling"] > 0, waits


def test_the_next_run_starts_from_what_the_tracker_learned(samples, recorded, tmp_path):
    args = ("1000", "1000", "1")
    native = run(samples / "changing_scalars", args)
    # synchronous, so that the first run surely compiles (and caches) the variant the second one needs
    env = under_shim(recorded, "changing_scalars", tmp_path, PROTEUS_ASYNC_COMPILATION="0")
    assert run(samples / "changing_scalars", args, **env).returncode == 0  # learns: k stops being folded
    again = run(samples / "changing_scalars", args, **env)
    assert again.returncode == 0 and again.stdout == native.stdout and "warning" not in again.stderr, again.stderr
    k = kernel(tmp_path, "accumulate_step")
    assert k["tracker"]["learned_from_earlier_runs"] == ["2"] and k["tracker"]["folded_now"] == [1, 3]
    # one variant, from the disk cache, from the first launch on
    assert (k["specializations"], k["disk_cache_hits"], k["specialized_launches"]) == (0, 1, 1000), k
    doc = json.loads((tmp_path / "report.json").read_text())
    # started before the first launch: Python and (exit being guarded) the compiler; the variant
    # the last run used, answered ahead (PROTEUS_PRELOAD), loaded by that launch
    assert doc["prestart"] == {"python": True, "compiler": True, "variants_loaded": 1, "compiler_skipped": False}
    assert doc["shim_wait_ms"]["miss_count"] == 1


def test_a_run_after_one_that_compiled_nothing_leaves_the_compiler_cold(samples, recorded, tmp_path):
    """The prestart thread's compiler warm-up (LLVM, nvJitLink) is skipped after a run that
    compiled nothing; a run that then needs a variant still gets it, from a compile thread."""
    args = ("1000", "1000", "1")
    native = run(samples / "changing_scalars", args)

    def again(args=args, **env):
        proc = run(samples / "changing_scalars", args, **under_shim(recorded, "changing_scalars", tmp_path, **env))
        assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
        doc = json.loads((tmp_path / "report.json").read_text())
        (k,) = doc["kernels"]
        prestart = dict(doc["prestart"])
        prestart.pop("variants_loaded")  # the last run's variants, loaded ahead or not (runtime/warm.py): not this test's
        return proc, prestart, k

    # synchronous, so that every variant the next runs ask for is surely in the cache
    again(PROTEUS_ASYNC_COMPILATION="0")
    _, prestart, k = again()  # all from the disk cache: it notes that it compiled nothing
    assert prestart == {"python": True, "compiler": True, "compiler_skipped": False} and k["specializations"] == 0
    proc, prestart, k = again()
    assert prestart == {"python": True, "compiler": False, "compiler_skipped": True}, prestart
    assert proc.stdout == native.stdout and k["specialized_launches"] == 1000 and k["specializations"] == 0
    # a guess gone wrong: n = 8192 is a new folded value, compiled on a compile thread (which
    # warms the compiler up first: in a run this short, the variant may only be ready at exit)
    bigger = ("1000", "1000", "1", "8192")
    proc, prestart, k = again(bigger)
    assert proc.stdout == run(samples / "changing_scalars", bigger).stdout
    assert prestart["compiler_skipped"] and k["specializations"] == 1, k
    # the run after that warms up ahead again, and finds the variant in the cache
    proc, prestart, k = again(bigger)
    assert prestart == {"python": True, "compiler": True, "compiler_skipped": False}
    assert proc.stdout == run(samples / "changing_scalars", bigger).stdout
    assert k["specializations"] == 0 and k["specialized_launches"] == 1000, k


def test_eight_threads_with_changing_scalars_stay_bounded(samples, recorded, tmp_path):
    args = ("8000", "8000", "8")  # 1,000 launches on each of 8 threads
    native = run(samples / "changing_scalars", args)
    env = under_shim(recorded, "changing_scalars", tmp_path)
    jit = run(samples / "changing_scalars", args, **env)
    assert jit.returncode == 0 and jit.stdout == native.stdout and "warning" not in jit.stderr, jit.stderr
    k = kernel(tmp_path, "accumulate_step")
    # k stops being folded (and perhaps the salt, one per thread): at most threads x (T + 2) + 1
    # (tests/unit/test_policy.py); 54 were compiled once under the ratio rule alone (H100, 6320f36)
    assert k["specializations"] <= 8 * (8 + 2) + 1
    # a run of some 50 ms may end before its first variant compiles: the compile threads finish
    # their queue at exit, so the next run starts warm
    assert k["specialized_launches"] + k["fallback_launches"] == 8000
    again = run(samples / "changing_scalars", args, **env)
    assert again.returncode == 0 and again.stdout == native.stdout
    k = kernel(tmp_path, "accumulate_step")
    assert (k["specializations"], k["specialized_launches"]) == (0, 8000), k


def test_asynchronous_compilation_gives_the_native_output(samples, recorded, tmp_path):
    for app, args in (("changing_scalars", ("20000", "20000", "4")), ("loop_count", ()), ("multi_kernel", ()),
                      ("device_globals", ())):
        native = run(samples / app, args)
        env = under_shim(recorded, app, tmp_path / app, PROTEUS_ASYNC_COMPILATION="1", PROTEUS_ASYNC_THREADS="2")
        jit = run(samples / app, args, **env)
        assert jit.returncode == 0 and jit.stdout == native.stdout and "warning" not in jit.stderr, (app, jit.stderr)
        doc = json.loads((tmp_path / app / "report.json").read_text())
        assert all(not k["failures"] and k["launch_errors"] == 0 for k in doc["kernels"]), doc
        if app == "changing_scalars":  # 5,000 launches on each of 4 threads: the app never waits for a compilation
            k = doc["kernels"][0]
            assert 0 < k["launches_while_compiling"] <= k["fallback_launches"]  # the original kernel ran meanwhile
            assert k["specialized_launches"] + k["fallback_launches"] == 20000
            assert k["specializations"] <= 4 * (8 + 2) + 1  # threads x (T + 2) + 1 (tests/unit/test_policy.py)
            again = run(samples / app, args, **env)  # what was queued compiled at exit: warm from the start
            assert again.returncode == 0 and again.stdout == native.stdout
            k = json.loads((tmp_path / app / "report.json").read_text())["kernels"][0]
            assert (k["specializations"], k["specialized_launches"]) == (0, 20000), k


def test_prewarmed_cache_means_zero_compilations(samples, recorded, tmp_path):
    for app in ("loop_count", "changing_scalars", "device_globals"):
        args = ("300", "300", "1") if app == "changing_scalars" else ()
        first = run(samples / app, args, **under_shim(recorded, app, tmp_path / "first"))
        assert first.returncode == 0
        shipped = tmp_path / f"shipped-{app}"
        pre = run_cli("prewarm", str(recorded[app]), "--from", str(tmp_path / "first" / "report.json"),
                      "--cache-dir", str(shipped))
        assert pre.returncode == 0, pre.stderr
        assert "compiled" in pre.stderr and "failed" not in pre.stderr, pre.stderr
        (tmp_path / "second").mkdir(exist_ok=True)
        env = under_shim(recorded, app, tmp_path / "second", PROTEUS_CACHE_DIR=str(shipped))
        second = run(samples / app, args, **env)
        assert second.returncode == 0 and second.stdout == first.stdout
        doc = json.loads((tmp_path / "second" / "report.json").read_text())
        # every kernel is served from the prewarmed cache, those with device variables too (their
        # addresses are set in the image as this process loads it)
        assert all(k["specializations"] == 0 for k in doc["kernels"]), (app, doc)
        assert all(k["disk_cache_hits"] > 0 for k in doc["kernels"] if k["specialized_launches"]), (app, doc)
        # prewarm noted that the next run compiles nothing: the compiler is not warmed up ahead
        assert doc["prestart"]["compiler_skipped"], (app, doc["prestart"])


def test_a_spent_compile_budget_runs_the_original_kernel_quietly(samples, recorded, tmp_path):
    args = ("500", "500", "1")
    native = run(samples / "changing_scalars", args)
    # no grace, and a budget of a billionth of the GPU time: the first variant (compiled while no
    # GPU time was known yet) is refused; at most one gets through before the budget is spent.
    # (Variants queued while that one compiled are dropped once the tracker stops folding k; a
    # second compile thread's variant meets the first's time so far: the H100 has four.)
    env = under_shim(recorded, "changing_scalars", tmp_path, PROTEUS_COMPILE_GRACE_MS="0", PROTEUS_COMPILE_BUDGET="1e-9")
    jit = run(samples / "changing_scalars", args, **env)
    assert jit.returncode == 0 and jit.stdout == native.stdout and "warning" not in jit.stderr, jit.stderr
    k = kernel(tmp_path, "accumulate_step")
    assert k["specializations"] <= 1 and k["budget_refusals"] >= 2 and k["specialized_launches"] < 100
