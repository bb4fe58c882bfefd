"""A job's ranks from the environment (jobenv.py), `%r`/`%p` in PROTEUS_REPORT paths, and the
shared tier's variables (PROTEUS_CACHE_SHARED, _SECRET, _SECRET_FILE, _UMASK, _LEASE_S): each
value taken, each malformed one a one-line error naming the variable, exit 2 through the
command line; upstream's PROTEUS_OBJECT_CACHE_CHAIN with MPI levels a note, never an error
(issue #52)."""

from __future__ import annotations

import json
import os

import pytest

from proteus_rewrite import jobenv
from proteus_rewrite.errors import ConfigError
from proteus_rewrite.jit import Config

from .test_exit_codes import cli, one_line

# ---------------------------------------------------------------- ranks


def test_no_launcher_variable_no_rank():
    assert jobenv.rank({}) is None
    assert jobenv.rank({"OMPI_COMM_WORLD_SIZE": "4", "SLURM_LOCALID": "1"}) is None  # sizes and local ids are not ranks


@pytest.mark.parametrize("name", jobenv.RANK_VARIABLES)
def test_each_launchers_rank_is_read(name):
    assert jobenv.rank({name: "7"}) == 7


def test_the_first_variable_in_order_wins():
    env = {name: str(i) for i, name in enumerate(jobenv.RANK_VARIABLES)}
    for i, name in enumerate(jobenv.RANK_VARIABLES):
        assert jobenv.rank(env) == i, name
        del env[name]
    assert jobenv.RANK_VARIABLES == ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                                     "MV2_COMM_WORLD_RANK", "FLUX_TASK_RANK")


def test_a_variable_that_holds_no_rank_is_passed_over():
    assert jobenv.rank({"SLURM_PROCID": "", "OMPI_COMM_WORLD_RANK": "x", "PMI_RANK": " 3 "}) == 3
    assert jobenv.rank({"SLURM_PROCID": "-1"}) is None


def test_report_paths_take_the_rank_or_the_pid():
    assert jobenv.expand_path("run.%r.json", {"SLURM_PROCID": "12"}, pid=99) == "run.12.json"
    assert jobenv.expand_path("run.%r.json", {}, pid=99) == "run.99.json"  # no rank: the pid
    assert jobenv.expand_path("out/%r/run.%p.json", {"PMI_RANK": "0"}, pid=99) == "out/0/run.99.json"
    assert jobenv.expand_path("100%%.%r.json", {"PMI_RANK": "1"}, pid=5) == "100%.1.json"
    assert jobenv.expand_path("run.%d.json", {"PMI_RANK": "1"}, pid=5) == "run.%d.json"  # unknown: kept
    assert jobenv.expand_path("run.json", {"PMI_RANK": "1"}, pid=5) == "run.json"
    assert jobenv.expand_path("run.%p.json") == f"run.{os.getpid()}.json"


# ---------------------------------------------------------------- the shared tier's variables

GOOD_URLS = ["file:///scratch/proteus", "file://localhost/scratch/proteus", "redis://node17", "redis://node17:6379/2",
             "redis://:pa55@node17:6380/0", "redis://user:pa55@node17", "rediss://cache.example.org:6390/1",
             "redis+unix:///tmp/redis.sock", "redis+unix:///tmp/redis.sock?db=3"]

BAD_URLS = {
    "http://node17:6379": "unknown scheme 'http'",
    "/scratch/proteus": "expected a file:///abs/dir",
    "file://scratch/proteus": "absolute directory",
    "file:scratch/proteus": "absolute directory",
    "redis://node17:99999": "port",
    "redis://node17:port/0": "port",
    "redis://:pa55@node17/x": "database /x",
    "redis://": "needs a host",
    "redis+unix://node17/tmp/redis.sock": "absolute socket path",
    "redis+unix:///tmp/redis.sock?db=one": "?db=one",
}


@pytest.mark.parametrize("url", GOOD_URLS)
def test_a_shared_url_is_taken(url):
    assert Config.from_env({"PROTEUS_CACHE_SHARED": url}).cache_shared == url


def test_no_shared_url_no_shared_tier():
    assert Config.from_env({}).cache_shared is None
    assert Config.from_env({"PROTEUS_CACHE_SHARED": " "}).cache_shared is None


@pytest.mark.parametrize(("url", "why"), BAD_URLS.items())
def test_a_malformed_shared_url_is_one_line_naming_the_variable(url, why):
    with pytest.raises(ConfigError) as e:
        Config.from_env({"PROTEUS_CACHE_SHARED": url})
    message = str(e.value)
    assert message.startswith("PROTEUS_CACHE_SHARED=") and why in message and "\n" not in message
    assert "pa55" not in message  # a password never reaches a job's log


def test_the_secret_from_the_variable_or_from_a_file(tmp_path):
    assert Config.from_env({}).cache_secret is None
    cfg = Config.from_env({"PROTEUS_CACHE_SECRET": "s3cret"})
    assert cfg.cache_secret == b"s3cret" and "s3cret" not in repr(cfg)
    (tmp_path / "secret").write_text("from-a-file\n")
    assert Config.from_env({"PROTEUS_CACHE_SECRET_FILE": str(tmp_path / "secret")}).cache_secret == b"from-a-file"


@pytest.mark.parametrize(("env", "why"), [
    ({"PROTEUS_CACHE_SECRET_FILE": "/nonexistent/secret"}, "PROTEUS_CACHE_SECRET_FILE='/nonexistent/secret': cannot read it"),
    ({"PROTEUS_CACHE_SECRET_FILE": "EMPTY"}, "the file is empty"),
    ({"PROTEUS_CACHE_SECRET_FILE": "EMPTY", "PROTEUS_CACHE_SECRET": "x"}, "both set"),
    ({"PROTEUS_CACHE_UMASK": "9"}, "PROTEUS_CACHE_UMASK='9': expected an octal umask"),
    ({"PROTEUS_CACHE_UMASK": "1000"}, "PROTEUS_CACHE_UMASK='1000'"),
    ({"PROTEUS_CACHE_UMASK": "g+w"}, "PROTEUS_CACHE_UMASK='g+w'"),
    ({"PROTEUS_CACHE_LEASE_S": "0"}, "PROTEUS_CACHE_LEASE_S='0': expected a positive number of seconds"),
    ({"PROTEUS_CACHE_LEASE_S": "-5"}, "PROTEUS_CACHE_LEASE_S='-5'"),
    ({"PROTEUS_CACHE_LEASE_S": "soon"}, "PROTEUS_CACHE_LEASE_S='soon'"),
])
def test_each_malformed_value_is_one_line(env, why, tmp_path):
    (tmp_path / "EMPTY").write_text("\n")
    env = {k: str(tmp_path / v) if v == "EMPTY" else v for k, v in env.items()}
    with pytest.raises(ConfigError) as e:
        Config.from_env(env)
    message = str(e.value).replace(str(tmp_path) + "/", "")
    assert why in message and "\n" not in message


@pytest.mark.parametrize(("raw", "value"), [("002", 0o002), ("0o027", 0o027), ("77", 0o077), ("0", 0)])
def test_the_umask_is_octal(raw, value):
    assert Config.from_env({"PROTEUS_CACHE_UMASK": raw}).cache_umask == value


def test_the_lease_defaults_to_30_seconds():
    assert Config.from_env({}).cache_lease_s == 30.0
    assert Config.from_env({"PROTEUS_CACHE_LEASE_S": "2.5"}).cache_lease_s == 2.5


def test_the_new_variables_take_no_note():
    env = {"PROTEUS_CACHE_SHARED": "redis://node17/0", "PROTEUS_CACHE_SECRET": "x", "PROTEUS_CACHE_UMASK": "002",
           "PROTEUS_CACHE_LEASE_S": "30"}
    assert Config.from_env(env).notes == ()


@pytest.mark.parametrize(("env", "variable"), [
    ({"PROTEUS_CACHE_SHARED": "ftp://node17/cache"}, "PROTEUS_CACHE_SHARED"),
    ({"PROTEUS_CACHE_SHARED": "redis://node17:0"}, "PROTEUS_CACHE_SHARED"),
    ({"PROTEUS_CACHE_SECRET_FILE": "/nonexistent/secret"}, "PROTEUS_CACHE_SECRET_FILE"),
    ({"PROTEUS_CACHE_UMASK": "8"}, "PROTEUS_CACHE_UMASK"),
    ({"PROTEUS_CACHE_LEASE_S": "never"}, "PROTEUS_CACHE_LEASE_S"),
])
def test_through_the_command_line_a_malformed_value_exits_2(env, variable, tmp_path):
    proc = cli("cache", "stats", "--dir", str(tmp_path / "cache"), env=env)
    assert proc.returncode == 2
    one_line(proc, variable)


# ---------------------------------------------------------------- upstream's chain


@pytest.mark.parametrize("chain", ["storage,mpi-local-lookup", "mpi-remote-lookup", "storage, mpi-local-lookup ,mpi-remote-lookup"])
def test_upstreams_mpi_levels_map_onto_the_shared_tier_with_a_note(chain):
    (note,) = Config.from_env({"PROTEUS_OBJECT_CACHE_CHAIN": chain}).notes
    assert note.startswith(f"PROTEUS_OBJECT_CACHE_CHAIN={chain!r}: the MPI levels")
    assert "map onto PROTEUS_CACHE_SHARED" in note and "file:// or redis:// URL" in note and "\n" not in note
    (note,) = Config.from_env({"PROTEUS_OBJECT_CACHE_CHAIN": chain, "PROTEUS_CACHE_SHARED": "file:///x"}).notes
    assert "PROTEUS_CACHE_SHARED, which is set" in note


def test_upstreams_storage_chain_needs_no_note():
    assert Config.from_env({"PROTEUS_OBJECT_CACHE_CHAIN": "storage"}).notes == ()


def test_the_mpi_chain_is_not_an_error_on_the_command_line(tmp_path):
    proc = cli("cache", "stats", "--dir", str(tmp_path / "cache"),
               env={"PROTEUS_OBJECT_CACHE_CHAIN": "storage,mpi-local-lookup"})
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------- the report


def test_the_runtimes_report_goes_to_the_ranks_file_and_records_the_rank_and_claims(tmp_path, monkeypatch):
    from proteus_rewrite.runtime.report import claim_counters, write_report

    class Cache:
        claim_stats = {"won": 2, "lost": 1, "broken": 0, "wait_s": 0.25, "shared_hits": 3, "write_failures": 0}

        def stats(self):
            return {}

    class Session:
        profile = None
        driver_version = 13000
        config = Config.from_env({})
        started = 0.0
        tables = []
        cache = Cache()
        compiler = None
        validation = None
        warm_up_skipped = False

    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    write_report(Session(), str(tmp_path / "run.%r.json"), b"")
    doc = json.loads((tmp_path / "run.5.json").read_text())
    assert doc["rank"] == 5 and doc["claims"] == Cache.claim_stats
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    for name in jobenv.RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    Session.cache = type("NoClaims", (), {"stats": lambda self: {}})()
    write_report(Session(), str(tmp_path / "run.%r.json"), b"")
    doc = json.loads((tmp_path / f"run.{os.getpid()}.json").read_text())
    assert doc["rank"] is None and doc["claims"] == {}
    assert claim_counters(lambda: {"won": 1, "note": "x", "flag": True}) == {"won": 1}


# ---------------------------------------------------------------- cache trim


def test_cache_trim_deletes_the_oldest_entries_down_to_max_mb(tmp_path):
    from proteus_rewrite.cache import Entry, StorageCache

    store = StorageCache(tmp_path / "cache")
    for i in range(4):
        store.put(Entry(f"{i:064x}", "cubin", 90, bytes(300_000), {"kernel": "k"}), enforce_cap=False)
        os.utime(store.path(f"{i:064x}"), (1_000_000 + i, 1_000_000 + i))
    proc = cli("cache", "trim", "--dir", str(tmp_path / "cache"), "--max-mb", "0.4")  # room for one
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("trimmed 3 entries from ") and "(down to 0.4 MiB)" in proc.stdout
    assert [p for p, _ in store.entries()] == [store.path(f"{3:064x}")]  # the newest stays


def test_cache_trim_shared_needs_the_shared_tier(tmp_path):
    proc = cli("cache", "trim", "--shared")
    assert proc.returncode == 2
    one_line(proc, "--shared", "PROTEUS_CACHE_SHARED")
    proc = cli("cache", "trim", "--shared", "--max-mb", "1", env={"PROTEUS_CACHE_SHARED": f"file://{tmp_path}/shared"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"trimmed 0 entries from file://{tmp_path}/shared")
