"""A real Slurm on localhost: ``munged``, ``slurmctld`` and two ``slurmd`` (nodes n1, n2).

Debian's ``slurm-wlm`` (``.ci/run`` installs it) runs as root with a generated munge key,
``proctrack/linuxproc`` and ``task/none`` (no cgroups needed), and two ``slurmd -N`` on
one host from ``NodeName=nX NodeAddr=127.0.0.1 Port=P``. Everything lives in one temporary
directory (config, state, spool, logs, munge socket) on ports picked here; clients find
it through ``SLURM_CONF``. The fixture stops every daemon it started, by pid, after
cancelling every job, and fails if a job's ``slurmstepd`` outlives it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
from typing import Iterator

import psutil
import pytest

from tests.conftest import wait_for

#: A driver (argv: GCS address, token file) that pins one task to each alive node and
#: prints the nodes and where the tasks ran, as JSON.
WORKLOAD = textwrap.dedent("""
    import json, sys
    import lumos
    from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    lumos.init(address=sys.argv[1], _token=open(sys.argv[2]).read().strip())
    try:
        nodes = sorted(n["NodeID"] for n in lumos.nodes() if n["Alive"])

        @lumos.remote(num_cpus=1)
        def where():
            return lumos.get_runtime_context().get_node_id()

        refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                for n in nodes]
        print(json.dumps({"nodes": nodes, "ran_on": sorted(lumos.get(refs, timeout=60))}))
    finally:
        lumos.shutdown()
""")

def login_status(url: str) -> int:
    """HTTP status of a dashboard login link, without following its redirect (302: logged in)."""
    import http.client
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", f"{parts.path}?{parts.query}")
        return conn.getresponse().status
    finally:
        conn.close()


DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalSlurm:
    """The daemons of one private Slurm and the environment its clients need."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.conf = os.path.join(root, "slurm.conf")
        #: ``SLURM_CONF`` for clients, ``LUMOS_TMPDIR`` (short: socket paths) for the nodes.
        self.env = dict(os.environ, SLURM_CONF=self.conf, LUMOS_TMPDIR=os.path.join(root, "lumos"))
        self.env.pop("LUMOS_CLUSTER_TOKEN", None)
        self.env.pop("LUMOS_ADDRESS", None)
        self.procs: list[subprocess.Popen[bytes]] = []

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for name in sorted(os.listdir(os.path.join(self.root, "log"))):
            with open(os.path.join(self.root, "log", name), errors="replace") as f:
                out.append(f"--- {name}\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(out)

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = open(os.path.join(self.root, "log", f"{name}.out"), "ab")
        try:
            proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log", "lumos", "jobs"):
            os.makedirs(os.path.join(r, d), mode=0o700, exist_ok=True)
        key = os.path.join(r, "munge", "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, os.urandom(128))
        os.close(fd)
        sock = os.path.join(r, "munge", "munge.socket")
        munged = self._spawn("munged", ["munged", "--foreground", "--force", f"--key-file={key}",
                                        f"--socket={sock}", f"--pid-file={r}/munge/munged.pid",
                                        f"--seed-file={r}/munge/munged.seed", f"--log-file={r}/log/munged.log"])
        wait_for(lambda: os.path.exists(sock) or munged.poll() is not None, 10)
        if munged.poll() is not None:
            raise RuntimeError("munged exited")
        ctld, default_slurmd, n1, n2 = free_ports(4)
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=lumostest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={default_slurmd}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
KillWait=10
NodeName=n1 NodeAddr=127.0.0.1 Port={n1} CPUs=1 State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 Port={n2} CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
""")
        with open(os.path.join(r, "cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\n")
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", self.conf])
        for node in ("n1", "n2"):
            os.makedirs(os.path.join(r, "spool", node), mode=0o700, exist_ok=True)
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", self.conf])

        def idle() -> bool:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError("a Slurm daemon exited during start-up")
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True,
                                 text=True, timeout=10)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            return states.get("n1") == "idle" and states.get("n2") == "idle"
        wait_for(idle, 30, 0.3)

    def run(self, *cmd: str, timeout: float = 30) -> str:
        out = subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr}")
        return out.stdout

    def jobs(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").split()

    def job_processes(self, job_id: str) -> list[psutil.Process]:
        """Every process that belongs to ``job_id`` (by its environment: Slurm sets SLURM_JOB_ID)."""
        out = []
        for p in psutil.process_iter():
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_CONF") == self.conf:
                out.append(p)
        return out

    def stepds(self) -> list[psutil.Process]:
        """``slurmstepd`` processes of this Slurm (they daemonize away from slurmd)."""
        out = []
        for p in psutil.process_iter():
            try:
                if p.name() == "slurmstepd" and p.environ().get("SLURM_CONF") == self.conf:
                    out.append(p)
            except (psutil.Error, OSError):
                continue
        return out

    def stop(self) -> None:
        left_jobs: list[str] = []
        stepds: list[psutil.Process] = []
        try:
            if self.procs and all(p.poll() is None for p in self.procs):
                jobs = self.jobs()
                if jobs:
                    self.run("scancel", *jobs)
                try:
                    wait_for(lambda: not self.jobs(), 60, 0.5)
                except AssertionError:
                    left_jobs = self.jobs()
                try:
                    wait_for(lambda: not self.stepds(), 30, 0.3)
                except AssertionError:
                    stepds = self.stepds()
                    for p in stepds:
                        p.kill()
        finally:
            for proc in reversed(self.procs):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in reversed(self.procs):
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        assert not left_jobs, f"Slurm jobs still queued after scancel: {left_jobs}"
        assert not stepds, f"slurmstepd processes left behind (killed): {[p.pid for p in stepds]}"


@pytest.fixture
def short_root() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="k8", dir="/tmp")  # socket paths must stay short
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm() -> Iterator[LocalSlurm]:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        print(f"Slurm tests skipped: {', '.join(missing)} not installed (apt-get install slurm-wlm munge)")
        pytest.skip(f"Slurm is not installed: {', '.join(missing)} missing (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        print("Slurm tests skipped: the private slurmctld/slurmd need root")
        pytest.skip("a private Slurm (slurmd as SlurmdUser=root) needs root")
    root = tempfile.mkdtemp(prefix="sl", dir="/tmp")
    cluster = LocalSlurm(root)
    try:
        try:
            cluster.start()
        except (RuntimeError, AssertionError, OSError) as e:
            reason = f"the Slurm daemons did not start ({e}):\n{cluster.log_tail()}"
            print(reason)
            pytest.skip(reason)
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
