"""The shared cache tier on Redis (proteus_rewrite/redis_tier.py), against a real redis-server on a unix socket
of its own: no TCP port, no persistence, killed at the end.

Compiles are stand-ins (a sleep, then the process's pid appended to a file opened with O_APPEND): how many
processes compiled is counted from that file, never from Redis.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from proteus_rewrite import redis_tier
from proteus_rewrite.cache import TOMBSTONE, Entry, LevelStats
from proteus_rewrite.errors import CacheError

ROOT = Path(__file__).resolve().parents[2]
IN_CI = bool(os.environ.get("CI"))


def _unavailable(reason: str) -> None:
    """CI installs redis-server and the redis package (scripts/install-deps, requirements.lock): there, missing
    is a failure; elsewhere the tests are skipped, saying why."""
    if IN_CI:
        pytest.fail(f"{reason}, and CI must run these tests", pytrace=False)
    pytest.skip(reason)


class Server:
    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.sock = os.path.join(directory, "redis.sock")
        self.url = f"redis+unix://{self.sock}?db=0"
        self.proc: subprocess.Popen | None = None

    def start(self, exe: str) -> None:
        import redis

        cmd = [exe, "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700", "--save", "", "--appendonly", "no"]
        cmd += ["--dir", self.dir, "--logfile", os.path.join(self.dir, "redis.log"), "--daemonize", "no"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                log = Path(self.dir, "redis.log")
                pytest.fail(f"redis-server exited ({self.proc.returncode}): {log.read_text() if log.exists() else ''}")
            try:
                if redis.Redis(unix_socket_path=self.sock, socket_timeout=0.5, socket_connect_timeout=0.5).ping():
                    return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail("redis-server did not answer PING within 10 s")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL ends a SIGSTOPped server too
            self.proc.wait()

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)


@pytest.fixture
def redis_server():
    exe = shutil.which("redis-server")
    if exe is None:
        _unavailable("redis-server is not installed (scripts/install-deps installs it)")
    try:
        import redis  # noqa: F401
    except ImportError:
        _unavailable("the redis Python package is not installed (it is in requirements.lock)")
    # a short directory of its own: a unix socket's path is limited to 107 bytes, tmp_path can be longer
    server = Server(tempfile.mkdtemp(prefix="prt-redis-"))
    try:
        server.start(exe)
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_warning(monkeypatch):
    """The one-warning-per-process flag, as a new process has it."""
    monkeypatch.setattr(redis_tier, "_warned", False)


# A process of the job: looks a key up, claims it on a miss, compiles (a stand-in), publishes, releases.
WORKER = r"""
import json, logging, os, sys, threading, time
from pathlib import Path
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
from proteus_rewrite.cache import Entry
from proteus_rewrite.errors import CacheError
from proteus_rewrite.redis_tier import RedisTier

a = json.loads(sys.argv[1])
tier = RedisTier(a["url"], a["secret"].encode() if a.get("secret") else None)
put_errors = 0


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.005)


def compile_(key):
    if a.get("claimed"):
        Path(a["claimed"]).write_text(str(os.getpid()))
    time.sleep(a.get("compile_s", 0.2))
    fd = os.open(a["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, b"%d\n" % os.getpid())
    os.close(fd)
    return Entry(key, "cubin", 90, b"variant of %s compiled by %d" % (key.encode(), os.getpid()))


def fetch(key):
    global put_errors
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        e = tier.get(key)
        if e is not None:
            return e
        c = tier.claim(key, a["lease"])
        if c is None:
            time.sleep(0.02)
            continue
        try:
            e = tier.get(key, counted=False)  # published between the miss and the claim
            if e is None:
                stop = threading.Event()
                def keep():
                    while not stop.wait(a["lease"] / 3):
                        tier.renew(c)
                threading.Thread(target=keep, daemon=True).start()
                try:
                    e = compile_(key)
                finally:
                    stop.set()
                try:
                    tier.put(e)
                except CacheError:
                    put_errors += 1
            return e
        finally:
            tier.release(c)
    sys.exit("no entry and no claim within 30 s")


mode = a["mode"]
if mode == "fetch":
    if a.get("ready"):
        fd = os.open(a["ready"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, b"%d\n" % os.getpid())
        os.close(fd)
        wait_for(a["go"])
    e = fetch(a["key"])
    Path(a["out"], str(os.getpid())).write_bytes(e.data)
elif mode == "outage":
    first = fetch("before")
    Path(a["ready"]).write_text("up")
    wait_for(a["go"])
    t0 = time.monotonic()
    results = [fetch(f"after-{i}").data.decode() for i in range(20)]
    c = tier.claim("after-0", a["lease"])
    print(json.dumps({"elapsed": time.monotonic() - t0, "results": len(results), "put_errors": put_errors,
                      "claim_local": c is not None and tier.renew(c), "dead": tier.dead, "get": tier.get("before") is None}))
elif mode == "tombstone":
    tier.tombstone(a["key"], 90, "ptxas: out of registers")
elif mode == "read":
    e = tier.get(a["key"])
    print(json.dumps(None if e is None else {"kind": e.kind, "arch": e.arch, "meta": e.meta}))
"""


@pytest.fixture
def worker(tmp_path):
    prog = tmp_path / "worker.py"
    prog.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PROTEUS_DEBUG", None)

    def start(**args) -> subprocess.Popen:
        args.setdefault("log", str(tmp_path / "compiles"))
        args.setdefault("lease", 5.0)
        cmd = [sys.executable, str(prog), json.dumps(args)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    return start


def _finish(proc: subprocess.Popen, timeout: float = 30) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker {proc.pid} exited {proc.returncode}:\n{err}"
    return out


def _compiles(tmp_path) -> list[int]:
    p = tmp_path / "compiles"
    return [int(x) for x in p.read_text().split()] if p.exists() else []


def test_64_processes_miss_one_key_at_once_and_exactly_one_compiles(redis_server, worker, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ready, go = tmp_path / "ready", tmp_path / "go"
    procs = [worker(mode="fetch", url=redis_server.url, key="k64", out=str(out), ready=str(ready), go=str(go)) for _ in range(64)]
    try:
        deadline = time.monotonic() + 60  # 64 interpreters starting on a loaded 2-core machine
        while len(ready.read_text().split() if ready.exists() else []) < 64:  # all started: then all miss at once
            assert time.monotonic() < deadline, "64 workers did not start within 60 s"
            assert all(p.poll() is None for p in procs), [p.communicate()[1] for p in procs if p.poll() is not None][:1]
            time.sleep(0.02)
        go.touch()
        for p in procs:
            _finish(p)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    compiled = _compiles(tmp_path)
    assert len(compiled) == 1, f"{len(compiled)} processes compiled the key"
    variants = {f.read_bytes() for f in out.iterdir()}
    assert len(list(out.iterdir())) == 64
    assert variants == {b"variant of k64 compiled by %d" % compiled[0]}


def test_a_claimant_killed_mid_compile_is_taken_over_after_its_lease(redis_server, worker, tmp_path):
    out, claimed = tmp_path / "out", tmp_path / "claimed"
    out.mkdir()
    lease = 1.0
    # the claimant renews every lease/3 while it compiles (60 s): only its death lets the claim lapse
    first = worker(mode="fetch", url=redis_server.url, key="kk", out=str(out), claimed=str(claimed), compile_s=60, lease=lease)
    try:
        deadline = time.monotonic() + 20
        while not claimed.exists():
            assert first.poll() is None, first.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(lease * 1.5)  # past one lease: renewals held the claim
        t0 = time.monotonic()
        second = worker(mode="fetch", url=redis_server.url, key="kk", out=str(out), compile_s=0.1, lease=lease)
        time.sleep(0.8)
        assert _compiles(tmp_path) == [] and second.poll() is None  # the live claimant's claim holds
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        _finish(second)
        took = time.monotonic() - t0
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
    assert _compiles(tmp_path) == [second.pid]
    assert (out / str(second.pid)).read_bytes() == b"variant of kk compiled by %d" % second.pid
    assert took < 0.8 + lease + 3, f"the takeover took {took:.1f} s"


def test_a_claim_is_renewed_released_and_token_checked(redis_server):
    a = redis_tier.RedisTier(redis_server.url)
    b = redis_tier.RedisTier(redis_server.url)
    c = a.claim("key", 0.3)
    assert c is not None and c.key == "key"
    assert b.claim("key", 0.3) is None
    for _ in range(5):  # 0.5 s, longer than the lease: held by renewals
        time.sleep(0.1)
        assert a.renew(c)
        assert b.claim("key", 0.3) is None
    a.release(c)
    c2 = b.claim("key", 0.2)
    assert c2 is not None
    assert not a.renew(c)  # released: not ours any more
    a.release(c)  # releasing a stale claim leaves b's alone
    assert a.claim("key", 0.2) is None
    time.sleep(0.3)  # b neither renews nor releases: its lease lapses
    assert not b.renew(c2)
    c3 = a.claim("key", 5)
    assert c3 is not None
    b.release(c2)  # b's stale release must not delete a's claim
    assert b.claim("key", 5) is None


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_redis_stopped_mid_run_fails_fast_with_one_warning_and_the_process_completes(redis_server, worker, tmp_path, how):
    ready, go = tmp_path / "ready", tmp_path / "go"
    p = worker(mode="outage", url=redis_server.url, out=str(tmp_path), ready=str(ready), go=str(go), compile_s=0.01)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        redis_server.stop() if how == "killed" else redis_server.freeze()
        go.touch()
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    r = json.loads(out)
    assert r["dead"] and r["results"] == 20 and r["claim_local"] and r["get"]
    assert r["put_errors"] == 20  # each put after the outage a CacheError, for the chain to count
    # 21 compiles ("before" and the 20 after): every miss compiled locally
    assert len(_compiles(tmp_path)) == 21
    warnings = [line for line in err.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "unreachable" in warnings[0], err
    # killed: refused at once; frozen: one socket timeout (OP_TIMEOUT_S), then nothing waits
    limit = 1.5 if how == "killed" else redis_tier.OP_TIMEOUT_S + 1.5
    assert r["elapsed"] < limit, r


def test_unreachable_from_the_start_is_one_warning_and_a_permanent_miss(tmp_path, caplog):
    pytest.importorskip("redis")
    tier = redis_tier.RedisTier(f"unix://{tmp_path}/no-such.sock")
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="proteus_rewrite"):
        assert tier.get("a") is None and tier.get("b") is None
        with pytest.raises(CacheError) as err:
            tier.put(Entry("a", "cubin", 90, b"x"))
        c = tier.claim("a", 10)
        assert c is not None and tier.renew(c)
        tier.release(c)
        tier.tombstone("a", 90, "bad")
        other = redis_tier.RedisTier(f"unix://{tmp_path}/no-such.sock")  # another tier, same process: no second warning
        assert other.get("a") is None
    assert time.monotonic() - t0 < 2
    assert "\n" not in str(err.value)
    assert tier.stats.misses == 2 and tier.stats.puts == 0
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


def test_entries_are_published_once(redis_server):
    a, b = redis_tier.RedisTier(redis_server.url), redis_tier.RedisTier(redis_server.url)
    a.put(Entry("k", "cubin", 90, b"first", {"kernel": "f"}))
    b.put(Entry("k", "cubin", 90, b"second"))
    got = b.get("k")
    assert got is not None and got.data == b"first" and got.meta["kernel"] == "f"
    assert a.stats.puts == 1 and b.stats.hits == 1
    assert b.get("missing") is None and b.stats.misses == 1
    b.get("missing", counted=False)
    assert b.stats.misses == 1
    assert a.trim(0.001) == 0  # Redis's maxmemory policy evicts, not the tier


def test_an_entry_without_the_secret_is_refused_and_recompiled(redis_server):
    unsigned = redis_tier.RedisTier(redis_server.url)
    unsigned.put(Entry("k", "cubin", 90, b"planted"))
    signed = redis_tier.RedisTier(redis_server.url, secret=b"job secret")
    assert signed.get("k") is None  # refused: a miss, counted
    assert signed.stats.misses == 1 and signed.stats.refused == 1 and signed.stats.hits == 0
    # the caller compiles again and publishes: the refused bytes are replaced, not kept by SET NX
    claim = signed.claim("k", 5)
    assert claim is not None
    signed.put(Entry("k", "cubin", 90, b"compiled"))
    signed.release(claim)
    fresh = redis_tier.RedisTier(redis_server.url, secret=b"job secret")  # another process of the job
    got = fresh.get("k")
    assert got is not None and got.data == b"compiled"
    wrong = redis_tier.RedisTier(redis_server.url, secret=b"another secret")
    assert wrong.get("k") is None and wrong.stats.refused == 1


def test_a_tombstone_is_seen_by_other_processes(redis_server, worker):
    _finish(worker(mode="tombstone", url=redis_server.url, key="doomed"))
    seen = json.loads(_finish(worker(mode="read", url=redis_server.url, key="doomed")))
    assert seen is not None and seen["kind"] == TOMBSTONE
    assert seen["meta"]["reason"] == "ptxas: out of registers" and seen["arch"] == 90
    # a real entry already published is never covered by a tombstone
    tier = redis_tier.RedisTier(redis_server.url)
    tier.put(Entry("fine", "cubin", 90, b"ok"))
    tier.tombstone("fine", 90, "late")
    assert tier.get("fine").data == b"ok"


@pytest.mark.parametrize(
    "url",
    [
        "redis://",
        "redis://:pw@/0",
        "redis://host:port/0",
        "redis://host:70000",
        "redis://host/zero",
        "redis://host/0?db=1",
        "redis://host?timeout=3",
        "redis+unix://",
        "redis+unix://somehost/tmp/sock",
        "unix:///tmp/sock?db=x",
        "http://host:6379",
        "host:6379",
        "",
    ],
)
def test_a_malformed_url_is_a_one_line_error_naming_the_setting(url):
    with pytest.raises(CacheError) as err:
        redis_tier.RedisTier(url)
    msg = str(err.value)
    assert "\n" not in msg and "PROTEUS_CACHE_SHARED" in msg, msg


@pytest.mark.parametrize(
    "url, args",
    [
        ("redis://cache.example:6380/3", {"host": "cache.example", "port": 6380, "db": 3}),
        ("redis://cache", {"host": "cache", "port": 6379, "db": 0}),
        ("redis://:p%40ss@cache/1", {"host": "cache", "port": 6379, "db": 1, "password": "p@ss"}),
        ("redis://user:pw@cache", {"host": "cache", "port": 6379, "db": 0, "username": "user", "password": "pw"}),
        ("rediss://cache:6390", {"host": "cache", "port": 6390, "db": 0, "ssl": True}),
        ("redis://[::1]:7000/2", {"host": "::1", "port": 7000, "db": 2}),
        ("redis+unix:///run/redis.sock?db=4", {"unix_socket_path": "/run/redis.sock", "db": 4}),
        ("unix:///run/redis.sock", {"unix_socket_path": "/run/redis.sock", "db": 0}),
        ("unix://:pw@/run/redis.sock", {"unix_socket_path": "/run/redis.sock", "db": 0, "password": "pw"}),
    ],
)
def test_urls_parse(url, args):
    assert redis_tier.parse_url(url) == args


def test_the_password_stays_out_of_messages():
    with pytest.raises(CacheError) as err:
        redis_tier.RedisTier("redis://:hunter2@host/nodb")
    assert "hunter2" not in str(err.value)


def test_without_the_redis_package_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis raises ImportError
    with pytest.raises(CacheError) as err:
        redis_tier.RedisTier("redis://localhost")
    assert str(err.value) == "the redis Python package is not installed (pip install proteus-rewrite[redis])"


def test_stats_are_the_cache_levels_kind():
    pytest.importorskip("redis")
    assert isinstance(redis_tier.RedisTier("redis://localhost").stats, LevelStats)


def test_open_shared_gives_a_redis_tier_that_the_chain_claims_and_fills(redis_server, tmp_path):
    from proteus_rewrite.cache import make_chain
    from proteus_rewrite.tiers import open_shared

    opened = open_shared("redis://localhost:1/2", None, None, 7.0)  # connects on first use, not here
    assert isinstance(opened, redis_tier.RedisTier) and opened.lease_s == 7.0
    here = make_chain(True, str(tmp_path / "node1"), shared=redis_tier.RedisTier(redis_server.url, lease_s=5))
    there = make_chain(True, str(tmp_path / "node2"), shared=redis_tier.RedisTier(redis_server.url, lease_s=5))
    claim = here.acquire("k", 0)
    assert claim is not None and there.acquire("k", 0) is None  # one compiler across "nodes"
    with here.renewing(claim):
        here.put(Entry("k", "cubin", 90, b"variant"))
    here.release(claim)
    hit = there.get("k")
    assert hit is not None and hit[0].data == b"variant" and hit[1] == "redis"
    assert there.get("k")[1] == "memory"  # filled into the earlier levels
