"""Workers forked from the raylet's fork server (``worker_start="fork"``, the default)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import psutil
import pytest

import lumos
from lumos._private.config import Config
from lumos.exceptions import ActorDiedError
from tests.conftest import lumos_children, process_gone, raylet_log, wait_for


@lumos.remote(num_cpus=0)
class Probe:
    def info(self) -> dict:
        import random

        import numpy as np
        main = sys.modules["__main__"]
        return {"pid": os.getpid(), "ppid": os.getppid(), "random": random.random(),
                "numpy": float(np.random.rand()),
                "start": getattr(getattr(main, "__spec__", None), "name", ""),
                "pgid": os.getpgid(0), "sid": os.getsid(0), "fds": _fd_targets("self"),
                "threads": sorted(_thread_names())}

    def gcs_durable(self) -> list[bool]:
        """[whether the raylet told this worker if the GCS is durable, the answer]."""
        from lumos._private import worker_context
        cw = worker_context.require()
        return [cw._gcs_durable_known, cw._gcs_durable]

    def gcs_requests(self) -> int:
        """Requests this worker has sent the GCS so far (on its one GCS connection)."""
        from lumos._private import worker_context
        return worker_context.require().gcs._next_rid - 1

    def exit(self, code: int) -> None:
        os._exit(code)


def _thread_names() -> list[str]:
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out.append(f.read().strip())
        except OSError:  # ended meanwhile
            continue
    return out


def _fd_targets(pid: str) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own fd)
            continue
    return out


def _children_running(module: str) -> list[psutil.Process]:
    # (a child lumos_children listed may exit before its command line is read again: a
    # worker killed a moment ago, not reaped yet)
    out = []
    for p in lumos_children():
        try:
            if module in " ".join(p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _fork_servers() -> list[psutil.Process]:
    return _children_running("lumos._private.worker.fork_server")


def _raylet() -> psutil.Process:
    (raylet,) = _children_running("lumos._private.raylet.server")
    return raylet


def test_actors_are_forked_children_of_the_raylet_with_their_own_random_state(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    fresh_cluster(num_cpus=1, include_dashboard=False)
    actors = [Probe.remote() for _ in range(4)]
    infos = lumos.get([a.info.remote() for a in actors], timeout=60)
    raylet = _raylet()
    assert {i["start"] for i in infos} == {"lumos._private.worker.fork_server"}
    assert {i["ppid"] for i in infos} == {raylet.pid}  # reparented: the raylet waits for them
    assert len({i["random"] for i in infos}) == 4
    assert len({i["numpy"] for i in infos}) == 4
    # The raylet's session, as a spawned worker has; each leads its own process group (what
    # its tasks start ends with it).
    assert {i["sid"] for i in infos} == {os.getsid(raylet.pid)} and all(i["pgid"] == i["pid"] for i in infos)
    # Nothing of the fork server's is inherited: not its control pipes, not its log.
    # (A worker the raylet forks to refill its pool shows the server's command line until
    # it names itself: wait until only the server does.)
    (server,) = wait_for(lambda: (lambda found: found if len(found) == 1 else None)(_fork_servers()), 20)
    # Forks from one thread only (numpy's BLAS threads, started as it warms up, are stopped).
    wait_for(lambda: len(os.listdir(f"/proc/{server.pid}/task")) == 1, 20)
    theirs = set(_fd_targets(str(server.pid))) - {"/dev/null"}
    assert theirs and not any(theirs & set(i["fds"]) for i in infos)
    # No resolver thread pool: the worker's TCP listener is bound without getaddrinfo.
    assert not any("libuv" in t for i in infos for t in i["threads"]), infos[0]["threads"]
    cmd = psutil.Process(infos[0]["pid"]).cmdline()
    assert "lumos._private.worker.main" in cmd and "--worker-id" in cmd
    for a in actors:
        lumos.kill(a)


def test_the_double_fork_path_makes_workers_children_of_the_raylet_too(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    """``worker_fork_clone=False`` (and platforms without the clone): the server forks a
    child that forks the worker and exits; the raylet, a child subreaper, adopts it."""
    ctx = fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"worker_fork_clone": False})
    actors = [Probe.remote() for _ in range(3)]
    infos = lumos.get([a.info.remote() for a in actors], timeout=60)
    raylet = _raylet()
    assert {i["start"] for i in infos} == {"lumos._private.worker.fork_server"}
    assert {i["ppid"] for i in infos} == {raylet.pid}
    with pytest.raises(ActorDiedError, match="exit code 7"):
        lumos.get(actors[0].exit.remote(7), timeout=60)
    assert "double-forked" in raylet_log(ctx)


def test_forked_worker_exit_code_is_reported(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    fresh_cluster(num_cpus=1, include_dashboard=False)
    a = Probe.remote()
    assert lumos.get(a.info.remote(), timeout=60)["start"] == "lumos._private.worker.fork_server"
    with pytest.raises(ActorDiedError, match="exit code 7"):
        lumos.get(a.exit.remote(7), timeout=60)


def test_killed_fork_server_falls_back_to_spawn_and_is_restarted(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    fresh_cluster(num_cpus=1, include_dashboard=False)
    before = Probe.remote()
    first = lumos.get(before.info.remote(), timeout=60)
    (server,) = wait_for(_fork_servers, 30)
    server.kill()
    wait_for(lambda: process_gone(server.pid), 10)
    # Workers it forked belong to the raylet: they live on.
    assert lumos.get(before.info.remote(), timeout=30)["pid"] == first["pid"]
    during = Probe.remote()
    assert lumos.get(during.info.remote(), timeout=60)["pid"] != first["pid"]
    # A new server comes up, and workers are forked from it again.
    (new,) = wait_for(lambda: [p for p in _fork_servers() if p.pid != server.pid], 30)
    assert new.pid != server.pid

    def forked_again() -> bool:
        a = Probe.remote()
        try:
            return lumos.get(a.info.remote(), timeout=60)["start"] == "lumos._private.worker.fork_server"
        finally:
            lumos.kill(a)
    wait_for(forked_again, 30, interval_s=0.2)
    for a in (before, during):
        lumos.kill(a)


@pytest.mark.slow
def test_stuck_fork_server_is_replaced_and_its_workers_spawned(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    fresh_cluster(num_cpus=1, include_dashboard=False)
    first = Probe.remote()
    lumos.get(first.info.remote(), timeout=60)
    (server,) = wait_for(_fork_servers, 30)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        late = Probe.remote()  # asked of the stopped server; spawned once it is given up on
        info = lumos.get(late.info.remote(), timeout=60)
        assert info["start"] == "lumos._private.worker.main"
    finally:
        if not process_gone(server.pid):
            os.kill(server.pid, signal.SIGCONT)
    wait_for(lambda: process_gone(server.pid), 10)
    wait_for(lambda: [p for p in _fork_servers() if p.pid != server.pid], 30)
    for a in (first, late):
        lumos.kill(a)


def test_spawn_start_method_still_works(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"worker_start": "spawn"})
    a = Probe.remote()
    info = lumos.get(a.info.remote(), timeout=60)
    assert info["start"] == "lumos._private.worker.main" and info["pgid"] == info["pid"]  # (its own group)
    assert not _fork_servers()

    @lumos.remote
    def ok() -> int:
        return 1

    assert lumos.get(ok.remote(), timeout=60) == 1
    lumos.kill(a)


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_new_workers_learn_from_the_raylet_whether_the_gcs_is_durable(fresh_cluster, start) -> None:  # type: ignore[no-untyped-def]
    """The raylet passes the GCS's answer on (in the fork request, or on a spawned
    worker's command line), so a new worker does not ask the GCS for it at start-up
    (the pre-started one, started while the raylet connects to the GCS, may ask)."""
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"worker_start": start})
    actors = [Probe.remote() for _ in range(3)]
    answers = lumos.get([a.gcs_durable.remote() for a in actors], timeout=60)
    assert [True, False] in answers and all(durable is False for _, durable in answers), answers
    for a in actors:
        lumos.kill(a)


def test_a_new_actor_worker_asks_the_gcs_nothing_before_its_first_call(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    """The creation task arrives with the job's config and the pickled class (the GCS
    adds them from its KV), and the raylet told the worker whether the GCS is durable:
    the worker's first request to the GCS, if any, comes after ``__init__``. (The
    pre-started worker, started while the raylet connects to the GCS, asks one.)"""
    fresh_cluster(num_cpus=1, include_dashboard=False)
    actors = [Probe.remote() for _ in range(3)]
    counts = lumos.get([a.gcs_requests.remote() for a in actors], timeout=60)
    assert 0 in counts and max(counts) <= 1, counts
    for a in actors:
        lumos.kill(a)


@lumos.remote(num_cpus=0)
class _Forked:
    def __init__(self) -> None:
        self.had_numpy = "numpy" in sys.modules  # (nothing of a worker's own imports it)

    def had(self) -> bool:
        return self.had_numpy


def test_actors_asked_for_right_after_init_are_forked_with_numpy_loaded(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    """The fork server loads numpy (and the rest of its warm-up) after its first
    ``WARM_AFTER_FORKS`` forks, not only once its pipe has been quiet: a burst of actors
    right after ``init`` kept it busy, and every one of them imported numpy itself (16
    numpy actors took 0.88 s here against 0.18 once warm; 0.51 now)."""
    from lumos._private.worker import fork_server
    pytest.importorskip("numpy")
    cpus = 2
    fresh_cluster(num_cpus=cpus, include_dashboard=False)
    actors = [_Forked.remote() for _ in range(16)]
    had = lumos.get([a.had.remote() for a in actors], timeout=60)
    # (the prestarted workers and the first forks came before the warm-up)
    assert sum(had) >= len(had) - cpus - fork_server.WARM_AFTER_FORKS, had


def test_fork_server_refuses_a_request_with_a_malformed_gcs_durable() -> None:
    from lumos._private.worker import fork_server
    reply = fork_server._serve_one(b'{"worker_id": "ab", "log": "/dev/null", "gcs_durable": "yes"}',
                                   os.getppid(), (None, None))
    assert reply["worker_id"] == "" and "gcs_durable" in reply["error"]


def test_worker_start_rejects_unknown_methods() -> None:
    with pytest.raises(ValueError, match="'fork' or 'spawn'"):
        Config.resolve({"worker_start": "vfork"})
    assert Config.resolve({"worker_start": "spawn"}).worker_start == "spawn"


@pytest.mark.slow
def test_two_hundred_cpu_free_actors_each_answer(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    fresh_cluster(num_cpus=2, include_dashboard=False)
    actors = [Probe.remote() for _ in range(200)]
    infos = lumos.get([a.info.remote() for a in actors], timeout=300)
    assert len({i["pid"] for i in infos}) == 200
    assert len({i["random"] for i in infos}) == 200
    born = {i["pid"]: psutil.Process(i["pid"]).create_time() for i in infos}
    for a in actors:
        lumos.kill(a)
    wait_for(lambda: all(process_gone(pid, created) for pid, created in born.items()), 60)


def test_orphans_of_workers_are_reaped(fresh_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The raylet is a child subreaper (forked workers become its children), so it also
    # inherits what a dead worker left running; those must not stay zombies.
    fresh_cluster(num_cpus=1, include_dashboard=False)

    @lumos.remote(num_cpus=0)
    class Parent:
        def start_child(self) -> int:
            import subprocess
            return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"]).pid

    a = Parent.remote()
    child = lumos.get(a.start_child.remote(), timeout=60)
    lumos.kill(a)
    raylet = _raylet()

    def orphaned() -> bool:
        try:
            return psutil.Process(child).ppid() == raylet.pid
        except psutil.NoSuchProcess:
            return True
    wait_for(orphaned, 30)
    wait_for(lambda: not psutil.pid_exists(child), 30)  # reaped, not left a zombie


def test_what_a_task_started_ends_with_its_worker_unless_it_left_the_group(fresh_cluster: Any) -> None:
    # As in Ray: a task's subprocess does not outlive its worker (it piled up on a
    # long-lived cluster until `lumos stop`); one started in a session of its own is a
    # daemon the task meant to leave running.
    fresh_cluster(num_cpus=1, include_dashboard=False)

    @lumos.remote(num_cpus=0)
    class Parent:
        def start(self) -> tuple[int, int, int]:
            import os
            import subprocess
            sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
            return (os.getpgid(0), subprocess.Popen(sleep).pid, subprocess.Popen(sleep, start_new_session=True).pid)

        def pid(self) -> int:
            import os
            return os.getpid()

    a = Parent.remote()
    worker = lumos.get(a.pid.remote(), timeout=60)
    group, child, daemon = lumos.get(a.start.remote(), timeout=60)
    assert group == worker  # the worker leads its own process group
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(child), 30)  # killed with its worker, and reaped
    assert psutil.Process(daemon).ppid() == _raylet().pid  # left running (an orphan the raylet adopted)
    os.kill(daemon, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(daemon), 30)


_CLONE_SCRIPT = r"""
import os, signal, sys
from lumos._private.worker.fork_server import CloneParent
clone = CloneParent.probe()
if clone is None:
    print("unsupported", flush=True)
    sys.exit(0)
pid = clone.fork()
if pid == 0:
    # The C library's idea of our thread id must be ours: raise() signals through it.
    got = []
    signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
    signal.raise_signal(signal.SIGUSR1)
    os._exit(5 if got else 1)
print(pid, flush=True)
"""


def test_clone_parent_makes_the_worker_a_child_of_the_fork_servers_parent() -> None:
    # One fork per worker: the clone is this process's child at once (this test process
    # is not a subreaper: a double-forked child would have gone to init), so it can wait
    # for it and read its exit code.
    import subprocess
    out = subprocess.run([sys.executable, "-c", _CLONE_SCRIPT], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    if out == "unsupported":
        pytest.skip("clone(CLONE_PARENT) is not used on this platform")
    pid = int(out)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        if not process_gone(pid):
            os.kill(pid, signal.SIGKILL)
    assert os.waitstatus_to_exitcode(status) == 5


_SERVE_SCRIPT = r"""
import os, sys
from lumos._private.worker import fork_server
fork_server.serve(os.getppid(), sys.argv[1:])
"""


def _serve_in_subprocess(tmp_path: Any) -> Any:
    import subprocess
    args = ["--raylet-socket", str(tmp_path / "r.sock"), "--gcs-address", "127.0.0.1:1",
            "--token-file", str(tmp_path / "token"), "--session-dir", str(tmp_path), "--node-id", "00",
            "--store-dir", str(tmp_path)]
    # Unbuffered: a line read ahead into a buffer would be invisible to ``select``.
    return subprocess.Popen([sys.executable, "-c", _SERVE_SCRIPT, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)


def _refused(tag: str) -> bytes:
    """A request the server answers without forking: its error names ``tag``."""
    import json
    return json.dumps({"worker_id": "ab", "log": os.devnull, "gcs_durable": tag}).encode() + b"\n"


def _send(proc: Any, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[proc.stdin.write(view):]


def _answers(proc: Any, n: int, timeout_s: float = 30.0) -> list[str]:
    """The errors of the server's next ``n`` answers (its ready and warmed-up lines skipped)."""
    import json
    import select
    import time
    out: list[str] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        assert select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0], out
        line = proc.stdout.readline()
        assert line, out  # (the server exited)
        msg = json.loads(line)
        if "error" in msg:
            out.append(msg["error"])
    return out


def test_fork_server_answers_requests_however_the_pipe_cuts_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Reads return what the pipe holds: a request in two reads, and one read ending two
    # requests and starting a third. Each is answered once, in order.
    import time
    reqs = [_refused(f"r{i}") for i in range(3)]
    data = b"".join(reqs)
    cuts = [0, 10, len(reqs[0]) + 5, len(data)]
    with _serve_in_subprocess(tmp_path) as proc:
        try:
            for a, b in zip(cuts, cuts[1:]):
                _send(proc, data[a:b])
                time.sleep(0.1)
            answers = _answers(proc, 3)
            assert [a.rsplit(" ", 1)[1] for a in answers] == ["'r0'", "'r1'", "'r2'"]
        finally:
            proc.kill()
            proc.wait(10)


def test_fork_server_drops_a_line_too_long_to_be_a_request_and_goes_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A line over the request limit is dropped whole (logged), not answered piecemeal: its
    # tail, after the part that went over, is no request either. The requests on either
    # side of it are answered.
    from lumos._private.worker import fork_server
    long_line = b"x" * (3 * fork_server._MAX_REQUEST_BYTES) + b"\n"
    with _serve_in_subprocess(tmp_path) as proc:
        try:
            _send(proc, _refused("before") + long_line + _refused("after"))
            answers = _answers(proc, 2)
            assert [a.rsplit(" ", 1)[1] for a in answers] == ["'before'", "'after'"], answers
            _send(proc, _refused("last"))
            proc.stdin.close()  # (the server returns at the end of its pipe)
            assert [a.rsplit(" ", 1)[1] for a in _answers(proc, 1)] == ["'last'"]
            assert proc.wait(30) == 0
            assert b"fork request longer than" in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_fork_server_is_ready_before_its_optional_imports(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The first workers of a new cluster must not wait for numpy: the server says ready
    # with only what a worker needs, and imports the optional modules once idle.
    with _serve_in_subprocess(tmp_path) as proc:
        _check_ready_then_warmed(proc, tmp_path)


def _check_ready_then_warmed(proc: Any, session_dir: Any) -> None:
    import json
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready = json.loads(proc.stdout.readline())
        assert "ready" in ready
        # What was imported when it said ready, from the process itself.
        with open(f"/proc/{proc.pid}/maps") as f:
            maps = f.read()
        assert "numpy" not in maps and "_psutil" not in maps
        fds = sorted(_fd_targets(str(proc.pid)))
        warmed = json.loads(proc.stdout.readline())
        assert warmed == {"warmed": ["numpy", "numpy.random", "psutil"]}
        with open(f"/proc/{proc.pid}/maps") as f:
            assert "numpy" in f.read()
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 1  # numpy's BLAS threads stopped again
        # The rehearsal of a worker's start (after the imports) left nothing behind: no
        # descriptor (a socket, a pipe), no thread, no directory.
        assert sorted(_fd_targets(str(proc.pid))) == fds
        assert not [p for p in os.listdir(session_dir) if p.startswith("rehearsal-")]
    finally:
        proc.kill()
        proc.wait(10)


_DIRTY_SCRIPT = r"""
import gc, os, sys
from lumos._private.config import Config
from lumos._private.worker import fork_server, main as worker_main
fork_server.preimport()
args = worker_main.parse_args(sys.argv[2:] + ["--worker-id", ""])
config = Config.resolve()
if sys.argv[1] == "rehearsed":
    worker_main.rehearse(args, config)
gc.collect()
gc.freeze()

def private_kib():
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Dirty", "Private_Clean")))

r, w = os.pipe()
pid = os.fork()
if pid == 0:  # a worker's start-up code, run in a forked child as a worker runs it
    before = private_kib()
    worker_main.rehearse(args, config)
    os.write(w, str(private_kib() - before).encode())
    os._exit(0)
os.close(w)
print(os.read(r, 64).decode(), flush=True)
os.waitpid(pid, 0)
"""


def test_a_rehearsed_fork_server_spares_its_children_the_pages_of_a_first_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A forked child copies each page of the template it writes, and code the template
    # never ran writes many (the interpreter specializes a function's bytecode the first
    # times it runs; caches fill). The fork server runs a worker's start once (its
    # rehearsal): a child running that start-up code again writes ~750 KiB less here
    # (~4.1 MiB without). Pages, not time: the count does not move with the machine's load.
    import subprocess
    args = ["--raylet-socket", str(tmp_path / "r.sock"), "--gcs-address", "127.0.0.1:1",
            "--token-file", str(tmp_path / "token"), "--session-dir", str(tmp_path), "--node-id", "00",
            "--store-dir", str(tmp_path)]

    def child_kib(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _DIRTY_SCRIPT, mode, *args], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        return int(out.strip())

    cold, rehearsed = child_kib("cold"), child_kib("rehearsed")
    assert rehearsed <= cold - 256, (cold, rehearsed)
    assert not [p for p in os.listdir(tmp_path) if p.startswith("rehearsal-")]


@lumos.remote(num_cpus=0)
class _PreloadProbe:
    def seen(self) -> tuple[int, bool]:
        return os.getpid(), "lumos_preload_probe" in sys.modules


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_worker_preload_modules_are_imported_before_any_task_asks(
        fresh_cluster, tmp_path, monkeypatch, start: str) -> None:  # type: ignore[no-untyped-def]
    """``worker_preload_modules``: with the fork server, imported once, in the server
    before its first fork (no worker imports it); spawned, by each worker as it starts.
    A module that fails to import is reported in the raylet's log and skipped."""
    log = tmp_path / "imported-by"
    (tmp_path / "lumos_preload_probe.py").write_text(
        f"import os\nwith open({str(log)!r}, 'a') as f:\n    f.write(f'{{os.getpid()}}\\n')\n")
    (tmp_path / "lumos_preload_broken.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    ctx = fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={
        "worker_start": start, "worker_preload_modules": "lumos_preload_broken, lumos_preload_probe"})
    if start == "fork":
        wait_for(lambda: "lumos_preload_probe imported" in raylet_log(ctx), 30)
        assert "could not import lumos_preload_broken (RuntimeError: broken on purpose)" in raylet_log(ctx)
    seen = lumos.get([a.seen.remote() for a in [_PreloadProbe.remote() for _ in range(3)]], timeout=60)
    assert all(loaded for _, loaded in seen), seen
    importers = log.read_text().split()
    if start == "fork":
        server = [str(p.pid) for p in _fork_servers()]
        assert importers == server, (importers, server)
    else:
        assert sorted(importers) == sorted(str(pid) for pid, _ in seen)


def test_worker_preload_modules_must_be_module_names() -> None:
    with pytest.raises(ValueError, match="not a module name"):
        Config.resolve({"worker_preload_modules": "torch transformers"})
    assert Config.resolve({"worker_preload_modules": " numpy , json"}).worker_preload_modules == " numpy , json"
