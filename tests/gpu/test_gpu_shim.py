"""End to end on the GPU: every sample, run natively and under LD_PRELOAD=libproteus.so,
prints the same checksums; the report shows specialized kernels really launched, and a
second run is served from the disk cache."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from bench.lib import cupti

from ..conftest import run_cli
from ..support.apps import run_app

pytestmark = pytest.mark.gpu

APPS = ["loop_count", "loop_count_dynamic", "loop_count_multi_arch", "loop_count_fembed", "warp_reduce",
        "device_globals", "multi_kernel", "two_tu",
        "two_tu_rdc", "mixed_nvcc", "templates", "annotated", "driver_api", "launch_overhead", "launch_overhead_dynamic",
        "launch_paths",
        # nvcc builds: the PTX route
        "loop_count_nvcc", "device_globals_nvcc", "templates_nvcc", "multi_kernel_nvcc", "warp_reduce_nvcc", "rdc_nvcc"]


def checksums(stdout: str) -> dict[str, str]:
    return {p[1]: p[2] for p in (l.split() for l in stdout.splitlines()) if len(p) == 3 and p[0] == "checksum"}


def run(exe, env_extra=None, args=()):
    return run_app(exe, args, env_extra)


@pytest.fixture(scope="module")
def recorded(samples, tmp_path_factory):
    """proteus-rewrite APP for every sample: {app: output dir}."""
    out = {}
    for app in APPS:
        d = tmp_path_factory.mktemp(app)
        proc = run_cli(str(samples / app), "-o", str(d))
        assert proc.returncode == 0, proc.stderr
        out[app] = d
    return out


# Every variant compiled before its launch (upstream's synchronous mode), so that every launch
# these samples make runs specialized and is checked as such. The default (auto) runs a
# kernel's first launch as built while its variant compiles: test_gpu_policy.py covers it.
SYNC = {"PROTEUS_ASYNC_COMPILATION": "0"}


def shim_env(outdir, cache, report, **extra):
    return {"LD_PRELOAD": str(outdir / "libproteus.so"), "PROTEUS_CACHE_DIR": str(cache), "PROTEUS_REPORT": str(report),
            **{**SYNC, **extra}}


@pytest.mark.parametrize("app", APPS)
def test_sample_under_the_shim_matches_native_and_uses_specialized_kernels(samples, recorded, tmp_path, app, kernel_trace):
    exe = samples / app
    args = ("2000",) if app.startswith("launch_overhead") else ()
    native = run(exe, args=args)
    assert native.returncode == 0, native.stderr
    cache, report = tmp_path / "cache", tmp_path / "report.json"

    ran = tmp_path / "cold.kernels"
    cold = run(exe, {**shim_env(recorded[app], cache, report), **kernel_trace(ran)}, args)
    assert cold.returncode == 0, cold.stderr
    assert checksums(cold.stdout) == checksums(native.stdout) != {}
    doc = json.loads(report.read_text())
    # the driver's account, not the shim's: every launch ran a variant, the nvcc-built kernels'
    # (from their PTX) too
    names = cupti.kernels_run(ran)
    assert cupti.variants(names) and not cupti.originals(names), names
    specialized = [k for k in doc["kernels"] if k.get("specialized_launches", 0) > 0]
    assert specialized, doc
    expect_unspecialized: set[str] = set()
    for k in doc["kernels"]:
        if k["name"] in expect_unspecialized:
            assert k["specialized_launches"] == 0
        else:
            assert k["fallback_launches"] == 0 and not k["failures"], k
            assert k["specializations"] >= 1
    assert "warning" not in cold.stderr, cold.stderr

    # the defaults, cold: a kernel's first launches may run as built while its variant compiles
    default = run(exe, shim_env(recorded[app], tmp_path / "cache-default", tmp_path / "default.json",
                                PROTEUS_ASYNC_COMPILATION="auto"), args)
    assert default.returncode == 0 and checksums(default.stdout) == checksums(native.stdout), default.stderr

    ran = tmp_path / "warm.kernels"
    warm = run(exe, {**shim_env(recorded[app], cache, report), **kernel_trace(ran)}, args)
    assert warm.returncode == 0 and checksums(warm.stdout) == checksums(native.stdout)
    names = cupti.kernels_run(ran)
    assert cupti.variants(names) and set(cupti.originals(names)) <= expect_unspecialized, names
    doc = json.loads(report.read_text())
    for k in doc["kernels"]:
        if k["name"] in expect_unspecialized:
            continue
        assert k["fallback_launches"] == 0
        # nothing compiled the second time, kernels with device variables included: their
        # addresses are set in the image as it is loaded, and are in no cache key
        assert k["specializations"] == 0 and k["disk_cache_hits"] >= 1, k


def test_device_globals_are_shared_between_jit_and_aot_code(samples, recorded, tmp_path):
    native = run(samples / "device_globals")
    jit = run(samples / "device_globals", shim_env(recorded["device_globals"], tmp_path / "c", tmp_path / "r.json"))
    assert jit.returncode == 0
    assert native.stdout == jit.stdout  # includes 'hits N' read back from the __device__ variable
    doc = json.loads((tmp_path / "r.json").read_text())
    assert {k["name"] for k in doc["kernels"] if k["specialized_launches"]} == {"_Z10accumulatePKfi", "_Z5applyPfPKfi"}


def test_contexts_share_variants_without_device_variables_and_keep_their_own_otherwise(samples, recorded, tmp_path):
    """driver_api contexts: both kernels in the primary context, then in a second one that
    loads the module again (the first still loaded) and sets its own `bias`. scale_plain's
    variant is a library launched by its CUkernel: the second context's launches hit it, so it
    is asked for once. scale_loop's reaches its context's `bias` through a pointer: one variant
    loaded per context, compiled once and set to each module's own address (output as native)."""
    exe = samples / "driver_api"
    native = run(exe, args=("contexts",))
    assert native.returncode == 0, native.stderr
    report = tmp_path / "report.json"
    proc = run(exe, shim_env(recorded["driver_api"], tmp_path / "cache", report), ("contexts",))
    assert proc.returncode == 0, proc.stderr
    assert checksums(proc.stdout) == checksums(native.stdout) and len(checksums(native.stdout)) == 4
    assert "warning" not in proc.stderr, proc.stderr
    kernels = {k["name"]: k for k in json.loads(report.read_text())["kernels"]}
    plain, loop = kernels["scale_plain"], kernels["scale_loop"]
    assert plain["launches"] == plain["specialized_launches"] == 6 and len(plain["variants"]) == 1, plain
    assert loop["launches"] == loop["specialized_launches"] == 6, loop
    assert (loop["specializations"], loop["memory_cache_hits"]) == (1, 1), loop
    assert len({v["launch"]["globals"]["bias"] for v in loop["variants"]}) == 2


def test_disable_is_a_pure_pass_through(samples, recorded, tmp_path):
    native = run(samples / "loop_count")
    off = run(samples / "loop_count", shim_env(recorded["loop_count"], tmp_path / "c", tmp_path / "r.json", PROTEUS_DISABLE="1"))
    assert off.returncode == 0 and off.stdout == native.stdout and off.stderr == ""
    assert not (tmp_path / "c").exists()


def test_nvcc_binary_and_foreign_store_run_their_original_kernels(samples, recorded, tmp_path):
    native = run(samples / "loop_count_nvcc")
    # loop_count's store does not describe the nvcc build: no fat binary matches
    shimmed = run(samples / "loop_count_nvcc", shim_env(recorded["loop_count"], tmp_path / "c", tmp_path / "r.json"))
    assert shimmed.returncode == 0 and checksums(shimmed.stdout) == checksums(native.stdout)
    assert "is not in any kernel store" in shimmed.stderr
    assert shimmed.stderr.count("warning") == 1  # one per fat binary


def test_trace_output_reports_specializations(samples, recorded, tmp_path):
    # upstream's tokens print upstream's lines on the app's stdout; this project's own on stderr
    proc = run(samples / "loop_count", shim_env(recorded["loop_count"], tmp_path / "c", tmp_path / "r.json",
                                                PROTEUS_TRACE_OUTPUT="specialization;kernel-trace;variants;launches"))
    assert proc.returncode == 0, proc.stderr
    assert "[KernelConfig] ID:_Z9axpy_loopiifPKfPf " in proc.stdout
    assert "[ArgSpec] Replaced Function _Z9axpy_loopiifPKfPf ArgNo 1 with value i32 8" in proc.stdout
    assert "=== Kernel Trace (rank 0) ===" in proc.stdout
    assert "axpy_loop(int, int, float, float const*, float*): variant" in proc.stderr
    assert "proteus: launch _Z9axpy_loopiifPKfPf grid 4096,1,1 block 256,1,1" in proc.stderr
    quiet = run(samples / "loop_count", shim_env(recorded["loop_count"], tmp_path / "c2", tmp_path / "r2.json"))
    assert "[KernelConfig]" not in quiet.stdout and "proteus:" not in quiet.stderr


def test_without_a_usable_python_the_original_kernels_run(samples, recorded, tmp_path):
    import shutil

    lonely = tmp_path / "noconfig"
    lonely.mkdir()
    shutil.copy(recorded["loop_count"] / "libproteus.so", lonely)
    shutil.copy(recorded["loop_count"] / "loop_count.kstore", lonely)  # but no proteus-python.cfg
    native = run(samples / "loop_count")
    proc = run(samples / "loop_count", shim_env(lonely, tmp_path / "c", tmp_path / "r.json"))
    assert proc.returncode == 0 and checksums(proc.stdout) == checksums(native.stdout)
    assert "proteus-python.cfg" in proc.stderr and proc.stderr.count("warning") == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    assert all(k["specialized_launches"] == 0 for k in doc["kernels"])


def test_an_app_that_runs_python_itself_uses_its_own_interpreter(samples, recorded, tmp_path):
    """The host process already runs Python (e.g. a Python program driving CUDA): the shim
    joins that interpreter under the GIL instead of starting another."""
    import sys

    code = ("import subprocess, sys, ctypes\n"
            "from cuda.bindings import driver as cu\n"
            "from tests.support.cuda_driver import Context\n"
            "from proteus_rewrite.fatbin import extract\n"
            "import numpy as np, struct\n"
            "ctx = Context()\n"
            "from tests.gpu.test_gpu_specializer import aot_cubin\n"
            "from pathlib import Path\n"
            f"img = aot_cubin(Path({str(samples / 'loop_count')!r}))\n"
            "buf = ctypes.create_string_buffer(img, len(img))\n"
            "mod = ctx.load(img)\n"
            "fn = ctx.function(mod, '_Z10mix_roundsyjxPy')\n"
            "n = 4096\n"
            "v = np.arange(n, dtype=np.uint64)\n"
            "dv = ctx.alloc(v)\n"
            "ctx.launch(fn, (16, 1, 1), (256, 1, 1), [struct.pack('<Q', n), struct.pack('<I', 5), struct.pack('<q', -42), "
            "dv.to_bytes(8, 'little')])\n"
            "print('done', ctx.read(dv, v)[:2])\n")
    env = dict(os.environ, **shim_env(recorded["loop_count"], tmp_path / "c", tmp_path / "r.json"),
               PYTHONPATH=os.pathsep.join([str(samples.parent.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=samples.parent.parent, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout and "warning" not in proc.stderr, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    (k,) = doc["kernels"]
    assert k["name"] == "_Z10mix_roundsyjxPy" and k["specialized_launches"] == 1, doc


REWRITE_APPS = ["loop_count", "loop_count_dynamic", "loop_count_nopie", "device_globals", "two_tu", "templates", "driver_api"]


@pytest.mark.parametrize("app", REWRITE_APPS)
def test_rewritten_executable_runs_specialized_without_ld_preload(samples, tmp_path, app, kernel_trace):
    proc = run_cli(str(samples / app), "-o", str(tmp_path / "dir"))
    assert proc.returncode == 0, proc.stderr
    native = run(samples / app)
    env = {"PROTEUS_CACHE_DIR": str(tmp_path / "c"), "PROTEUS_REPORT": str(tmp_path / "r.json"), **SYNC}
    rewritten = run(tmp_path / "dir" / app, {**env, **kernel_trace(tmp_path / "ran")})
    assert rewritten.returncode == 0, rewritten.stderr
    names = cupti.kernels_run(tmp_path / "ran")
    assert names and not cupti.originals(names), names
    assert checksums(rewritten.stdout) == checksums(native.stdout) != {}
    doc = json.loads((tmp_path / "r.json").read_text())
    assert all(k["specialized_launches"] == k["launches"] > 0 for k in doc["kernels"]), doc
    # the shim, loaded as the first DT_NEEDED entry, wrapped main: the compiler started ahead too
    assert doc["prestart"] == {"python": True, "compiler": True, "variants_loaded": 0, "compiler_skipped": False}, doc["prestart"]
    off = run(tmp_path / "dir" / app, {"PROTEUS_DISABLE": "1"})
    assert off.returncode == 0 and off.stdout == native.stdout


def test_rewritten_directory_is_self_contained(samples, tmp_path):
    import shutil

    assert run_cli(str(samples / "loop_count"), "-o", str(tmp_path / "built")).returncode == 0
    moved = tmp_path / "elsewhere" / "deep"
    shutil.copytree(tmp_path / "built", moved)
    shutil.rmtree(tmp_path / "built")
    proc = run(moved / "loop_count", {"PROTEUS_CACHE_DIR": str(tmp_path / "c"), "PROTEUS_REPORT": str(tmp_path / "r.json"), **SYNC})
    assert proc.returncode == 0 and checksums(proc.stdout) == checksums(run(samples / "loop_count").stdout)
    assert all(k["specialized_launches"] > 0 for k in json.loads((tmp_path / "r.json").read_text())["kernels"])


def test_stripped_rewritten_executable_runs_specialized(samples, tmp_path):
    import shutil

    src = tmp_path / "in" / "loop_count"
    src.parent.mkdir()
    shutil.copy(samples / "loop_count", src)
    subprocess.run(["strip", "--strip-all", str(src)], check=True)
    assert run_cli(str(src), "-o", str(tmp_path / "dir")).returncode == 0
    proc = run(tmp_path / "dir" / "loop_count",
               {"PROTEUS_CACHE_DIR": str(tmp_path / "c"), "PROTEUS_REPORT": str(tmp_path / "r.json"), **SYNC})
    assert proc.returncode == 0 and checksums(proc.stdout) == checksums(run(samples / "loop_count").stdout)
    assert all(k["specialized_launches"] > 0 for k in json.loads((tmp_path / "r.json").read_text())["kernels"])


FAULTS = ["specialize", "optimize", "ptx", "cubin", "module-load", "compiler-crash", "cache-unwritable", "cache-full",
          "cache-readonly"]


@pytest.mark.parametrize("fault", FAULTS)
def test_injected_fault_runs_the_original_kernel_with_one_warning(samples, recorded, tmp_path, fault):
    """annotated has one kernel: one failure, one warning; output and exit code as native."""
    native = run(samples / "annotated")
    proc = run(samples / "annotated", shim_env(recorded["annotated"], tmp_path / "c", tmp_path / "r.json",
                                               PROTEUS_FAULT_INJECT=fault))
    assert proc.returncode == native.returncode == 0
    assert proc.stdout == native.stdout
    warnings = [l for l in proc.stderr.splitlines() if "warning" in l]
    assert len(warnings) == 1, proc.stderr
    expected = {"module-load": "CUDA error 200", "compiler-crash": "the compiler process killed by SIGKILL"}.get(fault, "injected")
    assert expected in warnings[0], warnings[0]
    doc = json.loads((tmp_path / "r.json").read_text())
    (k,) = doc["kernels"]
    if fault.startswith("cache-"):
        assert k["specialized_launches"] == k["launches"]  # the cache failed, the JIT did not
    else:
        assert k["specialized_launches"] == 0 and k["fallback_launches"] == k["launches"]


def test_damaged_cache_entry_is_rebuilt_not_loaded(samples, recorded, tmp_path):
    env = shim_env(recorded["annotated"], tmp_path / "c", tmp_path / "r.json")
    native = run(samples / "annotated")
    assert run(samples / "annotated", env).stdout == native.stdout
    from proteus_rewrite import cache as cache_mod
    from proteus_rewrite.policy import WARM_KIND
    from proteus_rewrite.runtime.first_launch import PROFILE_KIND

    # the variant, not the run's notes: its launches (runtime/warm.py) and the kernel's profile (first_launch.py)
    (entry,) = [e for e in (tmp_path / "c").glob("*.pjc")
                if cache_mod.decode(e.read_bytes(), e.name[:-4]).kind not in (WARM_KIND, PROFILE_KIND)]
    raw = bytearray(entry.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    entry.write_bytes(bytes(raw))
    proc = run(samples / "annotated", env)
    assert proc.returncode == 0 and proc.stdout == native.stdout
    warnings = [l for l in proc.stderr.splitlines() if "warning" in l]
    assert len(warnings) == 1 and "damaged" in warnings[0]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["kernels"][0]["specializations"] == 1 and doc["cache"]["disk"]["corrupt"] == 1


def test_missing_store_runs_the_originals_with_one_warning(samples, recorded, tmp_path):
    import shutil

    bare = tmp_path / "nostore"
    bare.mkdir()
    for f in ("libproteus.so", "proteus-python.cfg"):
        shutil.copy(recorded["loop_count"] / f, bare)
    native = run(samples / "loop_count")
    proc = run(samples / "loop_count", shim_env(bare, tmp_path / "c", tmp_path / "r.json"))
    assert proc.returncode == 0 and proc.stdout == native.stdout
    warnings = [l for l in proc.stderr.splitlines() if "warning" in l]
    assert len(warnings) == 1 and "no kernel store" in warnings[0]


def test_store_of_another_build_matches_nothing_one_warning(samples, recorded, tmp_path):
    """The app was rebuilt after proteus-rewrite ran: same kernels, other fat binary bytes."""
    native = run(samples / "loop_count_lz4")
    proc = run(samples / "loop_count_lz4", shim_env(recorded["loop_count"], tmp_path / "c", tmp_path / "r.json"))
    assert proc.returncode == 0 and proc.stdout == native.stdout
    warnings = [l for l in proc.stderr.splitlines() if "warning" in l]
    assert len(warnings) == 1 and "not in any kernel store" in warnings[0]


@pytest.mark.parametrize("app", ["loop_count", "loop_count_dynamic"])
def test_a_warm_run_loads_the_last_runs_variants_ahead(samples, recorded, tmp_path, app, kernel_trace):
    """runtime/warm.py, shim/cuda_warm.c (PROTEUS_PRELOAD, on by default): a warm run's prestart
    thread makes Python's answers for the launches the last run noted before the app's first
    launch can miss, and a kernel's first launch loads its variants from them, for a static and a
    dynamic cudart. Every launch runs a variant, as in a warm run without it."""
    exe = samples / app
    native = run(exe)
    cache = tmp_path / "cache"
    cold = run(exe, shim_env(recorded[app], cache, tmp_path / "cold.json", PROTEUS_PRELOAD="1"))  # (which notes them)
    assert cold.returncode == 0 and checksums(cold.stdout) == checksums(native.stdout) != {}
    variants = sum(len(k["variants"]) for k in json.loads((tmp_path / "cold.json").read_text())["kernels"])
    for preload in ("", "0"):  # the default (on), and off
        ran = tmp_path / f"warm{preload}.kernels"
        report = tmp_path / f"warm{preload}.json"
        env = shim_env(recorded[app], cache, report, PROTEUS_ASYNC_COMPILATION="auto", **({"PROTEUS_PRELOAD": preload} if preload else {}))
        warm = run(exe, {**env, **kernel_trace(ran)})
        assert warm.returncode == 0 and checksums(warm.stdout) == checksums(native.stdout), warm.stderr
        names = cupti.kernels_run(ran)
        assert names and not cupti.originals(names), names
        doc = json.loads(report.read_text())
        loaded = doc["prestart"]["variants_loaded"]
        ahead = [v for k in doc["kernels"] for v in k["variants"] if v.get("loaded_ahead")]
        assert len(ahead) == loaded
        assert all(k["specializations"] == 0 for k in doc["kernels"])
        if preload == "0":
            assert loaded == 0 and doc["shim_wait_ms"]["miss_count"] >= variants
        else:  # answered before the first launch could miss (warm_first): every variant from the answers
            assert loaded == variants, doc["shim_wait_ms"]
