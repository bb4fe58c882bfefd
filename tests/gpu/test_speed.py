"""Speed trials on the GPU (PROTEUS_SPEED_CHECK): a variant made slower (the slow-code fault) is
timed against the original on live launches, dropped, and never launched by a later run; a
real variant is timed, judged and, kept, launched by later runs without a trial. What ran is
the driver's record (CUPTI), not the shim's."""

from __future__ import annotations

import json

import pytest

from bench.lib import cupti

from ..conftest import run_cli
from ..support.apps import run_app

pytestmark = pytest.mark.gpu

APP, ARGS = "launch_overhead", ["20000"]  # 20,100 launches of one kernel with one key
SAMPLES = ["loop_count", "warp_reduce", "device_globals", "multi_kernel", "templates", "annotated", "driver_api",
           "launch_paths", "two_tu", "changing_scalars", "launch_overhead", "launch_overhead_dynamic"]


def checksums(stdout: str) -> dict[str, str]:
    return {p[1]: p[2] for p in (l.split() for l in stdout.splitlines()) if len(p) == 3 and p[0] == "checksum"}


def run(exe, env_extra, args=ARGS):
    return run_app(exe, args, env_extra)


@pytest.fixture
def rewritten(samples, tmp_path):
    assert run_cli(str(samples / APP), "-o", str(tmp_path / "dir")).returncode == 0
    native = run(samples / APP, {})
    assert native.returncode == 0
    return tmp_path / "dir" / APP, checksums(native.stdout)


def _tool_run(exe, tmp_path, label, kernel_trace, args=ARGS, **env):
    report = tmp_path / f"{label}.json"
    p = run(exe, {"PROTEUS_CACHE_DIR": str(tmp_path / "cache"), "PROTEUS_REPORT": str(report),
                  **kernel_trace(tmp_path / f"{label}.ran"), **env}, args)
    assert p.returncode == 0, p.stderr
    k = max(json.loads(report.read_text())["kernels"], key=lambda k: k["launches"])  # the loop's kernel
    return p, k, [n for n in cupti.kernels_run(tmp_path / f"{label}.ran") if n.split("$")[0] == k["name"]]


# launch_overhead: 20,100 launches of a tiny kernel, each waiting for nothing, compiled on the
# first launch; changing_scalars: 4,000 launches over 64M elements, the GPU's work queued deep
# ahead of the host (its variant compiles in the background meanwhile)
CASES = {"0": ("launch_overhead", ARGS, 20100), "auto": ("changing_scalars", ["4000", "1", "1", str(1 << 26), "65536"], 4000)}


@pytest.mark.parametrize("mode", ["0", "auto"])
def test_a_slower_variant_is_dropped_and_never_launched_again(samples, tmp_path, kernel_trace, mode):
    app, args, launches = CASES[mode]
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    native = checksums(run(samples / app, {}, args).stdout)
    exe = tmp_path / "dir" / app
    p, k, ran = _tool_run(exe, tmp_path, "cold", kernel_trace, args, PROTEUS_FAULT_INJECT="slow-code",
                          PROTEUS_ASYNC_COMPILATION=mode)
    assert checksums(p.stdout) == native != {}
    (v,) = k["variants"]
    speed = v["speed"]
    assert speed["verdict"] == "slower", speed
    assert speed["variant_median_us"] > speed["original_median_us"] + 50  # the fault's spin: about 110 us
    assert 1 <= k["launches_timing_original"] <= 6  # the original's timed turns, until the verdict
    # the driver's record: the variant ran exactly as often as the report says; before its
    # verdict only (its turns, launches queued while a turn was timed)
    variants = len(cupti.variants(ran))
    assert variants == k["specialized_launches"], k
    assert 1 <= variants < launches // 2, variants
    assert len(ran) == k["launches"] == launches
    # the next run, fault gone, same cache: it remembers, and runs only the original
    p, k, ran = _tool_run(exe, tmp_path, "warm", kernel_trace, args, PROTEUS_ASYNC_COMPILATION=mode)
    assert checksums(p.stdout) == native
    assert ran and cupti.originals(ran) == ran
    assert k["slower_declined"] and k["slower_declined"][0]["speed"]["verdict"] == "slower"
    assert k["specialized_launches"] == 0 and k["launches_timing_original"] == 0


def test_a_real_variant_is_judged_and_later_runs_skip_its_trial(rewritten, tmp_path, kernel_trace):
    exe, native = rewritten
    p, k, ran = _tool_run(exe, tmp_path, "cold", kernel_trace, PROTEUS_ASYNC_COMPILATION="0")
    assert checksums(p.stdout) == native
    (v,) = k["variants"]
    speed = v["speed"]
    assert speed["verdict"] in ("kept", "slower") and 4 <= speed["timed_launches"] <= 12, speed
    assert 0 < speed["original_min_us"] <= speed["original_median_us"] and 0 < speed["variant_min_us"] <= speed["variant_median_us"]
    assert len(cupti.variants(ran)) == k["specialized_launches"]
    p, k, ran = _tool_run(exe, tmp_path, "warm", kernel_trace, PROTEUS_ASYNC_COMPILATION="0")
    assert checksums(p.stdout) == native and k["launches_timing_original"] == 0
    if speed["verdict"] == "kept":  # every launch the variant, untimed
        assert cupti.variants(ran) == ran and k["variants"][0]["speed"]["remembered"] is True
    else:
        assert cupti.originals(ran) == ran


def test_the_speed_check_off_times_nothing(rewritten, tmp_path, kernel_trace):
    exe, native = rewritten
    p, k, ran = _tool_run(exe, tmp_path, "off", kernel_trace, PROTEUS_ASYNC_COMPILATION="0", PROTEUS_SPEED_CHECK="0",
                          PROTEUS_FAULT_INJECT="slow-code")
    assert checksums(p.stdout) == native
    assert "speed" not in k["variants"][0] and k["launches_timing_original"] == 0
    assert cupti.variants(ran) == ran  # the slow variant ran every launch: nothing checked it


@pytest.mark.parametrize("app", SAMPLES)
def test_samples_keep_their_native_output_with_speed_trials(samples, tmp_path, kernel_trace, app):
    """The defaults: every sample's output native, cold and warm, and what the report counts as
    specialized is what the driver ran as variants."""
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    args = ["3000"] if app.startswith("launch_overhead") else []  # CUPTI's record of 100,000 launches loses some
    native = run(samples / app, {}, args)
    for label, env in (("cold", {"PROTEUS_ASYNC_COMPILATION": "0"}), ("default", {}), ("warm", {})):
        report = tmp_path / f"{label}.json"
        p = run(tmp_path / "dir" / app, {"PROTEUS_CACHE_DIR": str(tmp_path / "c"), "PROTEUS_REPORT": str(report),
                                         **kernel_trace(tmp_path / f"{label}.ran"), **env}, args)
        assert p.returncode == 0 and checksums(p.stdout) == checksums(native.stdout) != {}, (label, p.stderr)
        kernels = json.loads(report.read_text())["kernels"]
        ran = cupti.kernels_run(tmp_path / f"{label}.ran")
        assert len(cupti.variants(ran)) == sum(k.get("specialized_launches", 0) for k in kernels), (label, kernels)
        if label == "warm":  # judged variants are not timed again (one launched too few times still adds times)
            for k in kernels:
                judged = all((v.get("speed") or {}).get("remembered") for v in k.get("variants", []))
                assert not judged or k.get("launches_timing_original", 0) == 0, k


@pytest.mark.parametrize("preload", ["1", "0"])
def test_a_variant_left_undecided_is_judged_by_the_next_run_behind_a_deep_queue(samples, tmp_path, kernel_trace, preload):
    """A cold run too short for a short kernel's verdict (1 launch: one timed turn) leaves the slow
    variant undecided; the next run (with PROTEUS_PRELOAD=1, loading it ahead as the cold run
    noted) times it on launches queued far ahead of the GPU, drops it, and the run after that
    runs the original."""
    app = "changing_scalars"
    short, full = ["1", "1", "1", str(1 << 24), "65536"], ["300", "1", "1", str(1 << 24), "65536"]
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    exe = tmp_path / "dir" / app
    p, k, ran = _tool_run(exe, tmp_path, "cold", kernel_trace, short, PROTEUS_FAULT_INJECT="slow-code",
                          PROTEUS_ASYNC_COMPILATION="0", PROTEUS_PRELOAD="1")
    assert checksums(p.stdout) == checksums(run(samples / app, {}, short).stdout) != {}
    assert k["variants"][0]["speed"]["verdict"] == "undecided", k["variants"]
    native = checksums(run(samples / app, {}, full).stdout)
    p, k, ran = _tool_run(exe, tmp_path, "warm", kernel_trace, full, PROTEUS_PRELOAD=preload)
    assert checksums(p.stdout) == native
    (v,) = k["variants"]
    assert bool(v.get("loaded_ahead")) == (preload == "1") and v["speed"]["verdict"] == "slower", v
    # (its turns were queued far behind the host: judged at exit, while the context still held
    # their events; collected only at the report, after the runtime's teardown, they stayed undecided)
    assert len(cupti.variants(ran)) == k["specialized_launches"] and len(ran) == 300
    p, k, ran = _tool_run(exe, tmp_path, "again", kernel_trace, full, PROTEUS_PRELOAD=preload)
    assert checksums(p.stdout) == native and ran and cupti.originals(ran) == ran
