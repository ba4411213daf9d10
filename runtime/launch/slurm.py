"""lumos clusters as Slurm batch jobs: ``lumos slurm`` and ``SlurmCluster``.

A cluster is one batch job: the head on the first allocated node and one node per other
task, each a ``srun`` step running ``python -m lumos.launch.node``. ``SlurmCluster.scale``
adds nodes as one-node jobs that join it (the dask-jobqueue shape) and removes them with
``scancel``. Everything a cluster needs lives in one directory on a file system the
compute nodes share (default ``~/.lumos/slurm``):

```
lumos-<time>-<rand>/          0700
    token                     the cluster token (0600); nodes read it with --token-file
    cluster.sh, join.sh       the batch scripts, as submitted
    address                   HOST:PORT of the GCS, written by the head once it serves
    dashboard                 the dashboard's login link (0600), written by the head
    slurm-<jobid>.out         the jobs' output

sbatch cluster.sh ─► batch script (first node) ─► srun head step ─► writes address
                                     └─ waits for address ─► srun one step per other node (join)
   scancel / time limit / SIGTERM ─► trap: SIGTERM to both steps, wait, exit
```

The token never appears on a command line. Called by ``lumos.cli`` (``lumos slurm``)
and by ``python -m lumos.launch.slurm``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from lumos.exceptions import LumosError

#: Job states after which a job runs no more (squeue prints them briefly, then forgets the job).
_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
          "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT"}


class SlurmError(LumosError, RuntimeError):
    """A Slurm command failed, or a lumos job ended or stalled before its cluster was up."""


@dataclass(slots=True)
class SlurmJobSpec:
    """What one batch script asks of Slurm and of each lumos node."""

    #: Nodes in the job: the head and ``nodes - 1`` others (1 for a join job).
    nodes: int = 1
    cpus_per_node: int | None = None
    gpus_per_node: int | None = None
    #: Slurm time limit: minutes or ``[D-]HH:MM:SS``.
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    job_name: str = "lumos"
    object_store_memory: int | None = None
    #: Extra ``#SBATCH`` options, e.g. ``["--mem=64G", "--qos=debug"]``.
    sbatch_args: list[str] = field(default_factory=list)
    python: str = sys.executable
    dashboard: bool = True
    #: Port of the head's client server (``lumos://``, for notebooks off the cluster); None: none.
    client_server_port: int | None = 10001
    #: Join the cluster at this GCS address instead of starting a head.
    join_address: str | None = None
    #: A driver command run on the head's node once every node has joined; the job ends
    #: when it exits (with its status). It finds the cluster through ``LUMOS_ADDRESS`` and
    #: ``LUMOS_CLUSTER_TOKEN``.
    driver: list[str] = field(default_factory=list)

    def check(self) -> None:
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or self.nodes < 1:
            raise ValueError(f"nodes must be an int >= 1, got {self.nodes!r}")
        for name in ("cpus_per_node", "gpus_per_node", "object_store_memory", "client_server_port"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
        if self.cpus_per_node == 0:
            raise ValueError("cpus_per_node must be >= 1 (Slurm gives every task at least one CPU)")
        if self.driver and self.join_address is not None:
            raise ValueError("a join job runs no driver")
        for arg in self.sbatch_args:
            if not arg.startswith("-") or "\n" in arg:
                raise ValueError(f"sbatch_args entries are sbatch options like '--mem=64G', got {arg!r}")


def render_batch_script(spec: SlurmJobSpec, cluster_dir: str) -> str:
    """The batch script for ``spec``: a whole cluster, or one node that joins one."""
    spec.check()
    q = shlex.quote
    directives = [f"--job-name={spec.job_name}", f"--nodes={spec.nodes}", "--ntasks-per-node=1",
                  f"--output={os.path.join(cluster_dir, 'slurm-%j.out')}"]
    step = ["--ntasks-per-node=1"]
    node_args = []
    if spec.cpus_per_node is not None:
        directives.append(f"--cpus-per-task={spec.cpus_per_node}")
        step.append(f"--cpus-per-task={spec.cpus_per_node}")  # srun 22.05 does not inherit it
        node_args += ["--num-cpus", str(spec.cpus_per_node)]
    if spec.gpus_per_node is not None:
        if spec.gpus_per_node:
            directives.append(f"--gres=gpu:{spec.gpus_per_node}")
            step.append(f"--gres=gpu:{spec.gpus_per_node}")
        node_args += ["--num-gpus", str(spec.gpus_per_node)]
    if spec.object_store_memory is not None:
        node_args += ["--object-store-memory", str(spec.object_store_memory)]
    if spec.time is not None:
        directives.append(f"--time={spec.time}")
        # Ask for SIGUSR1 a minute before the time limit: the trap stops the nodes cleanly.
        directives.append("--signal=B:USR1@60")
    if spec.partition:
        directives.append(f"--partition={spec.partition}")
    if spec.account:
        directives.append(f"--account={spec.account}")
    directives += spec.sbatch_args
    token_file = os.path.join(cluster_dir, "token")
    address_file = os.path.join(cluster_dir, "address")
    lines = ["#!/bin/bash"] + [f"#SBATCH {d}" for d in directives] + [
        "# Written by `lumos slurm`: a lumos cluster for the life of this job.",
        "# The nodes read the cluster token from TOKEN_FILE; it is never on a command line.",
        "set -u",
        f"PYTHON={q(spec.python)}",
        f"TOKEN_FILE={q(token_file)}",
        f"ADDRESS_FILE={q(address_file)}",
        f"DASHBOARD_FILE={q(os.path.join(cluster_dir, 'dashboard'))}",
        f"CLIENT_FILE={q(os.path.join(cluster_dir, 'client'))}",
        f"NODE_ARGS=({' '.join(q(a) for a in node_args)})",
        f"STEP_ARGS=({' '.join(q(a) for a in step)})",
        "steps=()",
        "stop() {",
        "    trap - TERM INT USR1 HUP",
        '    [ -n "${driver_pid:-}" ] && kill -TERM "$driver_pid" 2>/dev/null && wait "$driver_pid"',
        '    echo "lumos: stopping the cluster nodes of job ${SLURM_JOB_ID}"',
        "    # SIGTERM to the steps' tasks, not to srun: srun turns a SIGTERM of its own into a",
        "    # SIGKILL for its step, and the nodes would leave their /dev/shm stores behind.",
        '    [ "${#steps[@]}" -gt 0 ] && scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null',
        "    wait",
        '    exit "${1:-0}"',
        "}",
        "trap 'stop 0' TERM INT USR1 HUP",
    ]
    if spec.join_address is None:
        lines += [
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            'rm -f "$ADDRESS_FILE" "$CLIENT_FILE"',
            'srun --nodes=1 --ntasks=1 --nodelist="$head_node" "${STEP_ARGS[@]}" \\',
            '    "$PYTHON" -m lumos.launch.node --head --port 0 --token-file "$TOKEN_FILE" \\',
            '    --address-file "$ADDRESS_FILE" '
            + ('--dashboard-file "$DASHBOARD_FILE" ' if spec.dashboard else "--no-dashboard ")
            + (f'--client-server-port {spec.client_server_port} --client-file "$CLIENT_FILE" '
               if spec.client_server_port is not None else "--no-client-server ")
            + '"${NODE_ARGS[@]}" &',
            "head_pid=$!",
            "steps+=($head_pid)",
            'while [ ! -s "$ADDRESS_FILE" ]; do',
            '    if ! kill -0 "$head_pid" 2>/dev/null; then',
            '        echo "lumos: the head node exited during start-up; see its lines above" >&2',
            "        stop 1",
            "    fi",
            "    sleep 0.5",
            "done",
            'address=$(cat "$ADDRESS_FILE")',
            'others=$((SLURM_JOB_NUM_NODES - 1))',
            'if [ "$others" -gt 0 ]; then',
            '    srun --nodes="$others" --ntasks="$others" --exclude="$head_node" "${STEP_ARGS[@]}" \\',
            '        "$PYTHON" -m lumos.launch.node --address "$address" --token-file "$TOKEN_FILE" \\',
            '        "${NODE_ARGS[@]}" &',
            "    steps+=($!)",
            "fi",
            'echo "lumos: cluster of ${SLURM_JOB_NUM_NODES} node(s) at $address (job ${SLURM_JOB_ID})"',
        ]
        if spec.driver:
            lines += [
                "# In the background: a trapped signal interrupts `wait`, not a foreground command.",
                '"$PYTHON" -m lumos.launch.node --address "$address" --token-file "$TOKEN_FILE" \\',
                '    --wait-for-nodes "$SLURM_JOB_NUM_NODES" --join-timeout-s 600 &',
                'wait $! || stop 1',
                "# The driver finds the cluster through the environment (the token is not on its command line).",
                'export LUMOS_ADDRESS="$address"',
                'LUMOS_CLUSTER_TOKEN=$(cat "$TOKEN_FILE")',
                "export LUMOS_CLUSTER_TOKEN",
                f"DRIVER=({' '.join(q(a) for a in spec.driver)})",
                '"${DRIVER[@]}" &',
                "driver_pid=$!",
                'wait "$driver_pid"',
                "status=$?",
                "driver_pid=",
                'echo "lumos: the driver exited with status $status"',
                'stop "$status"',
            ]
        else:
            lines += [
                "# The cluster lives as long as its head.",
                'wait "$head_pid"',
                "stop $?",
            ]
    else:
        lines += [
            f"address={q(spec.join_address)}",
            'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" "${STEP_ARGS[@]}" \\',
            '    "$PYTHON" -m lumos.launch.node --address "$address" --token-file "$TOKEN_FILE" \\',
            '    "${NODE_ARGS[@]}" &',
            "steps+=($!)",
            'wait "${steps[0]}"',
            "stop $?",
        ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- Slurm commands


def _slurm(cmd: list[str], timeout_s: float = 60.0) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise SlurmError(f"`{cmd[0]}` was not found: run this on a machine with the Slurm client commands "
                         "(a login node)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(cmd)}` did not finish within {timeout_s:.0f}s; is slurmctld up?") from None
    if out.returncode != 0:
        raise SlurmError(f"`{' '.join(cmd)}` failed (exit {out.returncode}): {out.stderr.strip()}")
    return out.stdout


def submit(script_path: str) -> str:
    """``sbatch`` the script; returns the job id."""
    out = _slurm(["sbatch", "--parsable", script_path]).strip()
    job_id = out.split(";", 1)[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id for {script_path}: {out!r}")
    return job_id


def job_state(job_id: str) -> tuple[str, str]:
    """``(state, reason)`` of a job, or ``("GONE", "")`` once squeue no longer lists it."""
    out = _slurm(["squeue", "-h", "-j", job_id, "-o", "%T|%r"])
    line = out.strip().splitlines()[0] if out.strip() else ""
    if not line:
        return "GONE", ""
    state, _, reason = line.partition("|")
    return state, reason


def cancel(job_ids: Sequence[str]) -> None:
    """``scancel``: Slurm sends SIGTERM to every process of the jobs (each node stops its
    processes and removes its object store), then SIGKILL after ``KillWait``."""
    if job_ids:
        _slurm(["scancel", *job_ids])


def wait_gone(job_ids: Sequence[str], timeout_s: float) -> None:
    """Wait until Slurm lists none of ``job_ids`` as pending or running."""
    deadline = time.monotonic() + timeout_s
    left = list(job_ids)
    while left:
        left = [j for j in left if job_state(j)[0] not in _ENDED | {"GONE"}]
        if left and time.monotonic() > deadline:
            raise SlurmError(f"Slurm jobs {', '.join(left)} were cancelled but still run after "
                             f"{timeout_s:.0f}s; check `squeue -j {','.join(left)}`")
        if left:
            time.sleep(0.5)


# ----------------------------------------------------------------------------- SlurmCluster


def default_job_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".lumos", "slurm")


def new_cluster_dir(job_dir: str) -> str:
    """A fresh 0700 directory for one cluster's token, scripts and output."""
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    path = os.path.join(job_dir, f"lumos-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}")
    os.mkdir(path, 0o700)
    return path


def _write_token(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
    finally:
        os.close(fd)


def prepare(spec: SlurmJobSpec, job_dir: str | None) -> tuple[str, str]:
    """A new cluster directory with a fresh token and the batch script; returns both paths."""
    cluster_dir = new_cluster_dir(job_dir or default_job_dir())
    _write_token(os.path.join(cluster_dir, "token"))
    script = os.path.join(cluster_dir, "cluster.sh")
    with open(script, "w") as f:
        f.write(render_batch_script(spec, cluster_dir))
    return cluster_dir, script


class SlurmCluster:
    """A lumos cluster running as Slurm batch jobs.

    The first job holds ``nodes`` nodes (the head and the others); ``scale`` adds or
    removes one-node jobs that join it; ``close`` cancels every job.

    Args:
        nodes: nodes of the first job (the head counts).
        cpus_per_node: CPUs per node (``--cpus-per-task``); None: Slurm's default.
        gpus_per_node: GPUs per node (``--gres=gpu:N``).
        time: time limit (``--time``): minutes or ``[D-]HH:MM:SS``.
        partition, account: ``--partition``, ``--account``.
        object_store_memory: store bytes per node.
        sbatch_args: extra ``#SBATCH`` options.
        job_dir: where the cluster's directory goes; compute nodes must see it.
        python: the interpreter the nodes run (default: this one; it must exist there).
        wait: wait until every node has joined.
        timeout_s: how long to wait (the job may queue first).

    Raises:
        SlurmError: sbatch failed, or the job ended or stalled before its nodes joined.

    Example:
        >>> cluster = SlurmCluster(nodes=4, cpus_per_node=32, gpus_per_node=4, time="2:00:00")
        >>> cluster.address, cluster.token_file
        >>> cluster.scale(8)
        >>> cluster.close()
    """

    def __init__(self, nodes: int = 1, cpus_per_node: int | None = None, gpus_per_node: int | None = None,
                 time: str | None = None, *, partition: str | None = None, account: str | None = None,
                 object_store_memory: int | None = None, sbatch_args: Sequence[str] = (),
                 job_dir: str | None = None, python: str | None = None, job_name: str = "lumos",
                 dashboard: bool = True, client_server_port: int | None = 10001, wait: bool = True,
                 timeout_s: float = 600.0,
                 _driver: Sequence[str] = ()) -> None:
        self._spec = SlurmJobSpec(nodes=nodes, cpus_per_node=cpus_per_node, gpus_per_node=gpus_per_node,
                                  time=time, partition=partition, account=account, job_name=job_name,
                                  object_store_memory=object_store_memory, sbatch_args=list(sbatch_args),
                                  python=python or sys.executable, dashboard=dashboard,
                                  client_server_port=client_server_port, driver=list(_driver))
        self._spec.check()
        #: The cluster's directory (token, scripts, address, job output).
        self.cluster_dir, script = prepare(self._spec, job_dir)
        #: The file holding the cluster token (0600).
        self.token_file = os.path.join(self.cluster_dir, "token")
        self._address_file = os.path.join(self.cluster_dir, "address")
        #: The job holding the head (and the first ``nodes - 1`` other nodes).
        try:
            self.job_id = submit(script)
        except BaseException:
            os.unlink(self.token_file)  # no job will ever read it
            raise
        #: One-node jobs added by ``scale``, oldest first.
        self.join_job_ids: list[str] = []
        self._address = ""
        self._closed = False
        if wait:
            try:
                self.wait_for_nodes(nodes, timeout_s)
            except BaseException:
                self.close()
                raise

    # -- state

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the GCS (waits for the head if it is not up yet)."""
        if not self._address:
            self._address = self._wait_for_address(600.0)
        return self._address

    @property
    def dashboard_url(self) -> str:
        """The dashboard's login link, once the head has started it ("" before, or without one)."""
        try:
            with open(os.path.join(self.cluster_dir, "dashboard")) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    @property
    def client_address(self) -> str:
        """``lumos://HOST:PORT`` for ``lumos.init(..., _token=token_file)`` from a machine outside the
        job (a login node, a laptop through a tunnel); "" before the head is up, or without a
        client server."""
        try:
            with open(os.path.join(self.cluster_dir, "client")) as f:
                return f.read().strip()
        except FileNotFoundError:
            return ""

    @property
    def token(self) -> str:
        with open(self.token_file) as f:
            return f.read().strip()

    def output_file(self, job_id: str | None = None) -> str:
        return os.path.join(self.cluster_dir, f"slurm-{job_id or self.job_id}.out")

    def __repr__(self) -> str:
        return (f"SlurmCluster(job_id={self.job_id!r}, nodes={self._spec.nodes + len(self.join_job_ids)}, "
                f"address={self._address or '(starting)'!r}, token_file={self.token_file!r})")

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _output_tail(self, job_id: str, lines: int = 20) -> str:
        try:
            with open(self.output_file(job_id), errors="replace") as f:
                return "".join(f.readlines()[-lines:]).rstrip()
        except OSError:
            return "(no output file yet)"

    def _check_running(self, job_id: str) -> str:
        state, reason = job_state(job_id)
        if state in _ENDED or state == "GONE":
            raise SlurmError(f"Slurm job {job_id} ended ({state}) before its lumos nodes were up; "
                             f"its output ({self.output_file(job_id)}) ends with:\n{self._output_tail(job_id)}")
        return f"{state} ({reason})" if reason and reason != "None" else state

    def _wait_for_address(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with open(self._address_file) as f:
                    text = f.read().strip()
                if text:
                    return text
            except FileNotFoundError:
                pass
            where = self._check_running(self.job_id)
            if time.monotonic() > deadline:
                raise SlurmError(f"the head of Slurm job {self.job_id} did not come up within {timeout_s:.0f}s "
                                 f"(job state {where}); see {self.output_file()}")
            time.sleep(0.5)

    def alive_nodes(self) -> list[Any]:
        """The cluster's ALIVE nodes as the GCS sees them."""
        from lumos._private.config import Config
        from lumos._private.transport.connection import parse_address
        from lumos.launch.node import gcs_nodes
        gcs = parse_address(self.address)
        assert isinstance(gcs, tuple)
        return [n for n in gcs_nodes(gcs, self.token.encode(), Config.resolve()) if n.state == "ALIVE"]

    def wait_for_nodes(self, n: int, timeout_s: float = 600.0) -> None:
        """Wait until ``n`` nodes are alive (the head counts).

        Raises:
            SlurmError: a job ended first, or ``timeout_s`` passed (with the jobs' states).
        """
        deadline = time.monotonic() + timeout_s
        if not self._address:
            self._address = self._wait_for_address(timeout_s)
        while True:
            alive = len(self.alive_nodes())
            if alive >= n:
                return
            states = [f"{j}: {self._check_running(j)}" for j in [self.job_id, *self.join_job_ids]]
            if time.monotonic() > deadline:
                raise SlurmError(f"{alive} of {n} lumos nodes joined within {timeout_s:.0f}s; "
                                 f"jobs: {', '.join(states)}; output in {self.cluster_dir}")
            time.sleep(0.5)

    # -- scaling

    def scale(self, n: int, *, wait: bool = True, timeout_s: float = 600.0) -> None:
        """Make the cluster ``n`` nodes: submit one-node join jobs, or cancel the newest ones
        (scaling down always waits until Slurm has ended them).

        Raises:
            ValueError: ``n`` is below the first job's node count (cancel it with ``close``).
            SlurmError: sbatch/scancel failed, or the nodes did not join within ``timeout_s``.
        """
        if self._closed:
            raise SlurmError(f"SlurmCluster of job {self.job_id} is closed; start a new one")
        if not isinstance(n, int) or isinstance(n, bool) or n < self._spec.nodes:
            raise ValueError(f"scale(n) needs an int >= {self._spec.nodes} (the first job's nodes), got {n!r}")
        current = self._spec.nodes + len(self.join_job_ids)
        if n > current:
            spec = dataclasses.replace(self._spec, nodes=1, join_address=self.address, driver=[],
                                       job_name=f"{self._spec.job_name}-join")
            script = os.path.join(self.cluster_dir, "join.sh")
            with open(script, "w") as f:
                f.write(render_batch_script(spec, self.cluster_dir))
            for _ in range(n - current):
                self.join_job_ids.append(submit(script))
            if wait:
                self.wait_for_nodes(n, timeout_s)
        elif n < current:
            drop = self.join_job_ids[n - self._spec.nodes:]
            del self.join_job_ids[n - self._spec.nodes:]
            cancel(drop)
            wait_gone(drop, timeout_s)

    def close(self, timeout_s: float = 120.0) -> None:
        """Cancel every job of the cluster and wait until Slurm has ended them; removes the token file."""
        if self._closed:
            return
        self._closed = True
        jobs = [*self.join_job_ids, self.job_id]
        try:
            cancel(jobs)
            wait_gone(jobs, timeout_s)
        finally:
            try:
                os.unlink(self.token_file)
            except FileNotFoundError:
                pass


# ----------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1, help="nodes in the job, the head included (default 1)")
    p.add_argument("--cpus-per-node", type=int, default=None, help="CPUs per node (--cpus-per-task)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (--gres=gpu:N)")
    p.add_argument("--time", default=None, help="time limit: minutes or [D-]HH:MM:SS")
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--object-store-memory", type=int, default=None, help="store bytes per node")
    p.add_argument("--job-name", default="lumos")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="OPTION",
                   help="extra #SBATCH option, e.g. --sbatch-arg=--mem=64G (repeatable)")
    p.add_argument("--job-dir", default=None,
                   help="directory for the cluster's token, scripts and output, on a file system the "
                        "compute nodes share (default ~/.lumos/slurm)")
    p.add_argument("--python", default=None, help="interpreter on the compute nodes (default: this one)")
    p.add_argument("--no-dashboard", action="store_true")
    p.add_argument("--client-server-port", type=int, default=10001,
                   help="port of the head's client server, for lumos:// drivers off the cluster (default 10001)")
    p.add_argument("--no-client-server", action="store_true", help="start no client server on the head")
    p.add_argument("--script-only", action="store_true", help="write the batch script, print its path, submit nothing")
    p.add_argument("--no-wait", action="store_true", help="return once submitted, without waiting for the nodes")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the nodes (default 600)")
    p.add_argument("driver", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="a driver to run on the head's node once all nodes joined; the job ends when it "
                        "exits (e.g. -- python train.py)")


def run(args: argparse.Namespace) -> int:
    """``lumos slurm``: write the batch script, submit it, wait for the nodes, print how to connect."""
    kwargs: dict[str, Any] = dict(
        nodes=args.nodes, cpus_per_node=args.cpus_per_node, gpus_per_node=args.gpus_per_node, time=args.time,
        partition=args.partition, account=args.account, job_name=args.job_name,
        object_store_memory=args.object_store_memory, sbatch_args=list(args.sbatch_arg),
        python=args.python or sys.executable, dashboard=not args.no_dashboard,
        client_server_port=None if args.no_client_server else args.client_server_port)
    driver = list(args.driver)
    if driver[:1] == ["--"]:
        driver = driver[1:]
    try:
        if args.script_only:
            kwargs["driver"] = driver
            spec = SlurmJobSpec(**kwargs)
            spec.check()
            print(prepare(spec, args.job_dir)[1])
            return 0
        cluster = SlurmCluster(**kwargs, job_dir=args.job_dir, wait=False, _driver=driver)
    except ValueError as e:
        print(f"lumos slurm: error: {e}", file=sys.stderr)
        return 2
    except SlurmError as e:
        print(f"lumos slurm: error: {e}", file=sys.stderr)
        return 1
    job_id = cluster.job_id
    print(f"submitted Slurm job {job_id} ({args.nodes} node(s)); output: {cluster.output_file()}", flush=True)
    print(f"token file: {cluster.token_file}", flush=True)
    if driver:
        print(f"the driver runs once all nodes joined; its output goes to {cluster.output_file()}, and the job "
              f"ends when it exits")
        return 0
    if args.no_wait:
        print(f"the head writes its address to {cluster._address_file}")
        return 0
    try:
        cluster.wait_for_nodes(args.nodes, args.timeout)
    except (SlurmError, ConnectionError, PermissionError) as e:
        print(f"lumos slurm: error: {e}\nthe job is still queued or running: `scancel {job_id}` ends it",
              file=sys.stderr)
        return 1
    address = cluster.address
    print(f"lumos cluster at {address}: {args.nodes} node(s) alive (Slurm job {job_id})")
    if cluster.dashboard_url:
        print(f"dashboard: {cluster.dashboard_url}")
    print("\nConnect from a node of the job, e.g.:\n"
          f"    srun --jobid {job_id} --overlap --nodes 1 --ntasks 1 python your_script.py\n"
          "with, in the script:\n"
          f"    lumos.init(address=\"{address}\", _token=open(\"{cluster.token_file}\").read().strip())\n"
          + (f"\nFrom a machine outside the job (no lumos node there; it must reach the head's port), with a "
             f"copy of the token file:\n    lumos.init(\"{cluster.client_address}\", _token=\"TOKEN_FILE\")\n"
             f"client address: {cluster.client_address}\n" if cluster.client_address else "")
          + f"\nStop with `scancel {job_id}`.", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lumos.launch.slurm",
                                description="start a lumos cluster as a Slurm batch job")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
