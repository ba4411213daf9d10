"""lumos on a real Slurm (see conftest.py): ``lumos slurm`` and ``SlurmCluster``.

Each test runs a workload that places one task on every node of the cluster, ends the
job(s) (the time-limit signal to the batch script, or ``scancel``), and checks that every process of the job has exited and every node's object
store and sockets are gone.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from typing import Any

import psutil
import pytest

from lumos._private.config import Config
from lumos.launch.node import gcs_nodes
from lumos.launch.slurm import SlurmCluster, SlurmJobSpec, render_batch_script
from tests.conftest import wait_for
from tests.launch.conftest import WORKLOAD, LocalSlurm, login_status

LUMOS = os.path.join(os.path.dirname(sys.executable), "lumos")

def run_workload(slurm: LocalSlurm, address: str, token_file: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", WORKLOAD, address, token_file], env=slurm.env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"workload failed:\n{out.stdout}\n{out.stderr}"
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def node_files(address: str, token_file: str) -> list[str]:
    """Object store directories and socket directories of the cluster's alive nodes."""
    host, port = address.rsplit(":", 1)
    with open(token_file, "rb") as f:
        token = f.read().strip()
    nodes = [n for n in gcs_nodes((host, int(port)), token, Config.resolve()) if n.state == "ALIVE"]
    return [p for n in nodes for p in (n.object_store_dir, os.path.join(n.session_dir, "sockets"))]


def assert_nothing_left(slurm: LocalSlurm, procs: list[psutil.Process], files: list[str]) -> None:
    assert procs, "the job's processes were not found"

    def gone() -> bool:
        return all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in procs)
    try:
        wait_for(gone, 60, 0.3)
    except AssertionError:
        left = [(p.pid, " ".join(p.cmdline())[:100]) for p in procs if p.is_running()]
        raise AssertionError(f"processes of the cancelled job still run: {left}") from None
    left_files = [p for p in files if os.path.exists(p)]
    assert not left_files, f"node files left behind: {left_files}"
    wait_for(lambda: not slurm.jobs(), 60, 0.3)  # COMPLETING until slurmctld hears from every node


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lumos_slurm_runs_a_task_on_every_node_and_its_trap_stops_everything(slurm: LocalSlurm) -> None:
    out = subprocess.run([LUMOS, "slurm", "--nodes", "2", "--cpus-per-node", "1", "--no-dashboard",
                          "--client-server-port", "0",
                          "--job-dir", os.path.join(slurm.root, "jobs"), "--timeout", "120"],
                         env=slurm.env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, f"lumos slurm failed:\n{out.stdout}\n{out.stderr}\n{slurm.log_tail()}"
    job_id = re.search(r"submitted Slurm job (\d+)", out.stdout).group(1)  # type: ignore[union-attr]
    address = re.search(r"lumos cluster at (\S+): 2 node\(s\) alive", out.stdout).group(1)  # type: ignore[union-attr]
    token_file = re.search(r"token file: (\S+)", out.stdout).group(1)  # type: ignore[union-attr]
    # The head's client server, for a notebook outside the job.
    assert re.search(r"^client address: lumos://[\d.]+:\d+$", out.stdout, re.M), out.stdout
    assert os.stat(token_file).st_mode & 0o777 == 0o600
    with open(token_file) as f:
        token = f.read().strip()
    with open(os.path.join(os.path.dirname(token_file), "cluster.sh")) as f:
        assert token not in f.read(), "the batch script must not carry the token"
    try:
        result = run_workload(slurm, address, token_file)
        assert len(result["nodes"]) == 2
        assert result["ran_on"] == result["nodes"]
        procs = slurm.job_processes(job_id)
        # Every lumos process of the job runs without the token on its command line.
        for p in procs:
            assert token not in " ".join(p.cmdline())
        files = node_files(address, token_file)
        # What the time limit does (--signal=B:USR1@60): signal the batch script only. Its
        # trap must stop both srun steps, so the job ends on its own.
        slurm.run("scancel", "--batch", "--signal=USR1", job_id)
        assert_nothing_left(slurm, procs, files)
    finally:
        if slurm.jobs():
            slurm.run("scancel", job_id)
    with open(os.path.join(os.path.dirname(token_file), f"slurm-{job_id}.out")) as f:
        assert "stopping the cluster nodes" in f.read()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_slurm_cluster_scales_up_and_down_and_close_cancels_its_jobs(slurm: LocalSlurm,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in slurm.env.items():
        if k in ("SLURM_CONF", "LUMOS_TMPDIR"):
            monkeypatch.setenv(k, v)
    cluster = SlurmCluster(nodes=1, cpus_per_node=1, job_dir=os.path.join(slurm.root, "jobs"), timeout_s=120,
                           client_server_port=0)
    procs: list[psutil.Process] = []
    files: list[str] = []
    try:
        assert len(cluster.alive_nodes()) == 1
        assert cluster.client_address.startswith("lumos://"), cluster.client_address
        # The head's dashboard: its login link is in the cluster's private directory only.
        wait_for(lambda: cluster.dashboard_url, 30, 0.3)
        assert login_status(cluster.dashboard_url) == 302
        assert os.stat(os.path.join(cluster.cluster_dir, "dashboard")).st_mode & 0o777 == 0o600
        with open(cluster.output_file()) as f:
            assert cluster.dashboard_url.split("token=")[1] not in f.read()
        cluster.scale(2, timeout_s=120)
        result = run_workload(slurm, cluster.address, cluster.token_file)
        assert len(result["nodes"]) == 2 and result["ran_on"] == result["nodes"]
        (join_job,) = cluster.join_job_ids
        join_procs = slurm.job_processes(join_job)
        procs = slurm.job_processes(cluster.job_id) + join_procs
        files = node_files(cluster.address, cluster.token_file)
        cluster.scale(1, timeout_s=60)
        wait_for(lambda: len(cluster.alive_nodes()) == 1, 30, 0.3)
        wait_for(lambda: all(not p.is_running() for p in join_procs), 30, 0.3)
    finally:
        cluster.close()
    assert_nothing_left(slurm, procs, files)
    assert not os.path.exists(cluster.token_file)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lumos_slurm_runs_a_driver_once_all_nodes_joined_and_the_job_ends_with_it(slurm: LocalSlurm) -> None:
    driver = ("import json, lumos; lumos.init(); "
              "print(json.dumps({'alive': sum(n['Alive'] for n in lumos.nodes())})); lumos.shutdown()")
    out = subprocess.run([LUMOS, "slurm", "--nodes", "2", "--cpus-per-node", "1", "--no-dashboard",
                          "--job-dir", os.path.join(slurm.root, "jobs"), "--", sys.executable, "-c", driver],
                         env=slurm.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"lumos slurm failed:\n{out.stdout}\n{out.stderr}"
    job_id = re.search(r"submitted Slurm job (\d+)", out.stdout).group(1)  # type: ignore[union-attr]
    output = re.search(r"output: (\S+)", out.stdout).group(1)  # type: ignore[union-attr]
    try:
        wait_for(lambda: not slurm.jobs(), 120, 0.5)
    finally:
        if slurm.jobs():
            slurm.run("scancel", job_id)
    with open(output) as f:
        text = f.read()
    assert '{"alive": 2}' in text and "the driver exited with status 0" in text, text
    assert "stopping the cluster nodes" in text
    assert not [d for d in os.listdir(slurm.env["LUMOS_TMPDIR"])
                if glob.glob(f"/dev/shm/lumos-{d}-*")], "object stores left behind"


def test_batch_script_passes_resources_and_never_the_token(tmp_path: Any) -> None:
    spec = SlurmJobSpec(nodes=3, cpus_per_node=8, gpus_per_node=2, time="1:00:00", partition="gpu",
                        account="proj", object_store_memory=2**30, sbatch_args=["--mem=64G"],
                        python="/opt/py env/bin/python")
    script = render_batch_script(spec, str(tmp_path))
    for line in ("#SBATCH --nodes=3", "#SBATCH --cpus-per-task=8", "#SBATCH --gres=gpu:2",
                 "#SBATCH --time=1:00:00", "#SBATCH --signal=B:USR1@60", "#SBATCH --partition=gpu",
                 "#SBATCH --account=proj", "#SBATCH --mem=64G",
                 "NODE_ARGS=(--num-cpus 8 --num-gpus 2 --object-store-memory 1073741824)",
                 "PYTHON='/opt/py env/bin/python'", "trap 'stop 0' TERM INT USR1 HUP"):
        assert line in script.splitlines(), line
    assert "--token-file" in script and "LUMOS_CLUSTER_TOKEN" not in script
    assert '--client-server-port 10001 --client-file "$CLIENT_FILE"' in script
    assert "--no-client-server" in render_batch_script(SlurmJobSpec(client_server_port=None), str(tmp_path))
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    driven = render_batch_script(SlurmJobSpec(nodes=2, driver=["python", "train.py", "--lr", "0.1 x"]),
                                 str(tmp_path))
    assert "DRIVER=(python train.py --lr '0.1 x')" in driven.splitlines()
    assert subprocess.run(["bash", "-n"], input=driven, text=True).returncode == 0
    with pytest.raises(ValueError, match="nodes must be"):
        render_batch_script(SlurmJobSpec(nodes=0), str(tmp_path))
    with pytest.raises(ValueError, match="sbatch options"):
        render_batch_script(SlurmJobSpec(sbatch_args=["mem=1G"]), str(tmp_path))
