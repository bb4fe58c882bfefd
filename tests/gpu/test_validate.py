"""PROTEUS_VALIDATE on the GPU: real variants pass and leave native output; a variant made to
differ (the wrong-code fault) is caught, denied, the output stays native, and later runs (the
cache directory's deny list, or the store `--validate` wrote) do not specialize the kernel.
The driver's own record (CUPTI) shows the variant ran beside the original."""

from __future__ import annotations

import json

import pytest

from bench.lib import cupti
from proteus_rewrite import store
from proteus_rewrite.runtime import validate

from ..conftest import run_cli
from ..support.apps import run_app

pytestmark = pytest.mark.gpu

APPS = ["loop_count", "warp_reduce", "device_globals", "multi_kernel", "templates", "annotated", "driver_api",
        "launch_paths", "two_tu"]
SYNC = {"PROTEUS_ASYNC_COMPILATION": "0"}


def checksums(stdout: str) -> dict[str, str]:
    return {p[1]: p[2] for p in (l.split() for l in stdout.splitlines()) if len(p) == 3 and p[0] == "checksum"}


def run(exe, env_extra=None):
    return run_app(exe, (), env_extra)


@pytest.mark.parametrize("app", APPS)
def test_validation_passes_real_variants_and_keeps_native_output(samples, tmp_path, app, kernel_trace, monkeypatch):
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    native = run(samples / app)
    for k, v in kernel_trace(tmp_path / "ran").items():
        monkeypatch.setenv(k, v)
    p = run_cli("validate", str(tmp_path / "dir" / app), "--cache-dir", str(tmp_path / "c"))
    assert p.returncode == 0, p.stderr
    assert checksums(p.stdout) == checksums(native.stdout) != {}
    summary = next(line for line in p.stderr.splitlines() if line.startswith("validation: "))
    matched = int(summary.split()[1])
    assert matched >= 1 and " 0 differ" in summary, p.stderr
    assert validate.read_deny(tmp_path / "c") == {}
    names = cupti.kernels_run(tmp_path / "ran")
    assert len(names) - len(cupti.originals(names)) >= matched, names  # each checked variant ran on the GPU


def test_a_wrong_variant_is_caught_denied_and_later_runs_keep_the_original(samples, tmp_path, kernel_trace, monkeypatch):
    app = "annotated"
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    native = run(samples / app)
    monkeypatch.setenv("PROTEUS_FAULT_INJECT", "wrong-code")
    p = run_cli("validate", str(tmp_path / "dir" / app), "--cache-dir", str(tmp_path / "c"))
    assert p.returncode == 12, p.stderr
    assert "its variant wrote different results" in p.stderr and "smooth" in p.stderr
    assert checksums(p.stdout) == checksums(native.stdout) != {}  # the original's results, always
    deny = validate.read_deny(tmp_path / "c")
    assert [n for n in deny if "smooth" in n], deny
    # the next run, fault gone, same cache: the kernel is not specialized, by the driver's record
    monkeypatch.delenv("PROTEUS_FAULT_INJECT")
    later = run(tmp_path / "dir" / app, {"PROTEUS_CACHE_DIR": str(tmp_path / "c"), "PROTEUS_REPORT": str(tmp_path / "r.json"),
                                         **SYNC, **kernel_trace(tmp_path / "ran")})
    assert later.returncode == 0 and checksums(later.stdout) == checksums(native.stdout)
    names = cupti.kernels_run(tmp_path / "ran")
    assert names and cupti.originals(names) == names, names
    (k,) = json.loads((tmp_path / "r.json").read_text())["kernels"]
    assert k["specialized_launches"] == 0 and any("denied by validation" in f for f in k["failures"]), k


def test_rewrite_with_validate_writes_the_deny_list_into_the_store(samples, tmp_path, monkeypatch):
    app = "annotated"
    monkeypatch.setenv("PROTEUS_FAULT_INJECT", "wrong-code")
    p = run_cli(str(samples / app), "-o", str(tmp_path / "dir"), "--validate")
    assert p.returncode == 12, p.stderr
    denied = store.read(tmp_path / "dir" / f"{app}.kstore").denied
    assert [n for n in denied if "smooth" in n], denied
    monkeypatch.delenv("PROTEUS_FAULT_INJECT")
    later = run(tmp_path / "dir" / app, {"PROTEUS_CACHE_DIR": str(tmp_path / "fresh"), "PROTEUS_REPORT": str(tmp_path / "r.json"),
                                         **SYNC})
    assert later.returncode == 0 and later.stdout == run(samples / app).stdout
    (k,) = json.loads((tmp_path / "r.json").read_text())["kernels"]
    assert k["specialized_launches"] == 0, k
    # and without the fault, --validate passes and denies nothing
    p = run_cli(str(samples / app), "-o", str(tmp_path / "ok"), "--validate")
    assert p.returncode == 0, p.stderr
    assert store.read(tmp_path / "ok" / f"{app}.kstore").denied == {}


def test_validation_skips_what_exceeds_its_size_cap_and_runs_the_original(samples, tmp_path):
    """loop_count's axpy_loop works on two arrays of 2^20 floats (8 MB): above a 1 MB cap it is
    not checked, says so, and runs its original code; the output stays native."""
    app = "loop_count"
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    p = run_cli("validate", str(tmp_path / "dir" / app), "--cache-dir", str(tmp_path / "c"), "--max-mb", "1")
    assert p.returncode == 0, p.stderr
    assert "not validated (its allocations hold" in p.stderr and "PROTEUS_VALIDATE_MAX_MB (1)" in p.stderr
    assert checksums(p.stdout) == checksums(run(samples / app).stdout)


def test_by_default_a_wrong_variant_is_caught_at_its_first_launch_and_denied(samples, tmp_path, kernel_trace):
    """The default mode (PROTEUS_VALIDATE unset): the variant made to differ is compared with the
    original on its first launch, denied, and the output stays native; the next run, fault gone,
    runs the original (the deny list)."""
    app = "annotated"
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    native = checksums(run(samples / app).stdout)
    env = {"PROTEUS_CACHE_DIR": str(tmp_path / "c"), "PROTEUS_VALIDATE": "once", **SYNC}
    p = run(tmp_path / "dir" / app, {**env, "PROTEUS_FAULT_INJECT": "wrong-code", "PROTEUS_REPORT": str(tmp_path / "r.json"),
                                     **kernel_trace(tmp_path / "ran")})
    assert p.returncode == 0 and checksums(p.stdout) == native != {}, p.stderr
    assert "its variant wrote different results" in p.stderr and "denied" in p.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    (k,) = doc["kernels"]
    assert [c["verdict"] for c in doc["validation"]] == ["differs"] and "smooth" in doc["validation"][0]["kernel"]
    names = cupti.kernels_run(tmp_path / "ran")
    assert len(cupti.variants(names)) == 1, names  # it ran once, in the original's shadow
    assert k["specialized_launches"] == 0, k
    later = run(tmp_path / "dir" / app, {**env, **kernel_trace(tmp_path / "ran2")})
    assert checksums(later.stdout) == native
    names = cupti.kernels_run(tmp_path / "ran2")
    assert names and cupti.originals(names) == names, names


@pytest.mark.parametrize("app", ["loop_count", "warp_sync", "warp_reduce", "device_globals", "multi_kernel", "templates",
                                 "annotated", "launch_paths", "two_tu", "loop_count_nvcc", "warp_reduce_nvcc"])
@pytest.mark.parametrize("mode", ["0", "auto"])
def test_by_default_each_variant_is_checked_once_and_a_warm_run_checks_nothing(samples, tmp_path, kernel_trace, app,
                                                                               mode):
    """The defaults (the check on, speed trials on), in the synchronous and the default mode, cold
    then warm: native output; each cold check ran its variant once beside the original (CUPTI);
    the warm run checks nothing and its variants are what the report counts."""
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    native = checksums(run(samples / app).stdout)
    env = {"PROTEUS_CACHE_DIR": str(tmp_path / "c"), "PROTEUS_VALIDATE": "once", "PROTEUS_SPEED_CHECK": "1",
           "PROTEUS_ASYNC_COMPILATION": mode}
    for label in ("cold", "warm"):
        report = tmp_path / f"{label}.json"
        p = run(tmp_path / "dir" / app, {**env, "PROTEUS_REPORT": str(report), **kernel_trace(tmp_path / f"{label}.ran")})
        assert p.returncode == 0 and checksums(p.stdout) == native != {}, (label, p.stderr)
        doc = json.loads(report.read_text())
        checks = doc.get("validation", [])
        names = cupti.kernels_run(tmp_path / f"{label}.ran")
        specialized = sum(k.get("specialized_launches", 0) for k in doc["kernels"])
        if label == "cold":  # every new variant compared once: matched, or denied with its reason
            assert all(c["verdict"] in ("same", "differs", "varies", "skipped") for c in checks), checks
            assert checks or mode == "auto"  # (in the background, a variant may land after the last launch)
            assert len(cupti.variants(names)) == specialized + sum(c["verdict"] != "skipped" for c in checks)
        else:  # its verdicts are in the cache: nothing is checked again (a variant first landing now is)
            assert all(c["verdict"] != "same" or mode == "auto" for c in checks), checks
            assert len(cupti.variants(names)) == specialized + sum(c["verdict"] != "skipped" for c in checks)


def test_by_default_a_variant_compiled_in_the_background_is_checked_and_then_serves(samples, tmp_path, kernel_trace):
    """changing_scalars, 4,000 launches queued deep ahead of the host, cold, the defaults: its
    variant compiles on a compile thread while the original runs; the launches after it lands
    check it once and then run it."""
    app, args = "changing_scalars", ["4000", "1", "1", str(1 << 26), "65536"]
    assert run_cli(str(samples / app), "-o", str(tmp_path / "dir")).returncode == 0
    native = checksums(run_app(samples / app, args).stdout)
    report = tmp_path / "r.json"
    p = run_app(tmp_path / "dir" / app, args, {"PROTEUS_CACHE_DIR": str(tmp_path / "c"), "PROTEUS_VALIDATE": "once",
                                                "PROTEUS_REPORT": str(report), **kernel_trace(tmp_path / "ran")})
    assert p.returncode == 0 and checksums(p.stdout) == native != {}, p.stderr
    doc = json.loads(report.read_text())
    assert [c["verdict"] for c in doc.get("validation", [])] == ["same"], doc.get("validation")
    assert len(cupti.variants(cupti.kernels_run(tmp_path / "ran"))) > 1000
