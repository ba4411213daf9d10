"""The cluster token stays off command lines: ``--token-file`` and ``LUMOS_CLUSTER_TOKEN``.

``--token`` still works but warns, since every local user can read a process's command
line in ``/proc``; ``lumos start --head`` recommends the file and environment forms.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from .test_cli import CliEnv, assert_all_gone

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture
def cli() -> Iterator[CliEnv]:
    env = CliEnv()
    try:
        yield env
    finally:
        env.cleanup()


def test_token_file_and_environment_are_accepted_and_token_on_the_command_line_warns(cli, tmp_path):
    head_out = cli.lumos("start", "--head", "--port", "0", "--num-cpus", "1", "--no-dashboard")
    assert "--token-file" in head_out.stdout and "LUMOS_CLUSTER_TOKEN" in head_out.stdout
    assert " --token " not in head_out.stdout, "the head recommends putting the token on a command line"
    address = cli.current()["gcs_address"]
    with open(cli.current()["token_path"]) as f:
        token = f.read().strip()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)

    joined = cli.lumos("start", "--address", address, "--token-file", str(token_file), "--num-cpus", "1")
    assert "joined the cluster" in joined.stdout and "warning" not in joined.stderr, joined.stderr

    bare = CliEnv()  # no current_cluster.json there: the token must come from the arguments
    try:
        status = bare.lumos("status", "--address", address, "--token-file", str(token_file), "--json")
        assert status.stderr == "" and '"state": "ALIVE"' in status.stdout
        bare.env["LUMOS_CLUSTER_TOKEN"] = token
        status = bare.lumos("status", "--address", address, "--json")
        assert status.stderr == "" and '"state": "ALIVE"' in status.stdout
        del bare.env["LUMOS_CLUSTER_TOKEN"]
        status = bare.lumos("status", "--address", address, "--token", token, "--json")
        assert '"state": "ALIVE"' in status.stdout
        assert "warning" in status.stderr and "/proc" in status.stderr and "--token-file" in status.stderr
        both = bare.lumos("status", "--address", address, "--token", token, "--token-file", str(token_file),
                          check=False)
        assert both.returncode == 1 and "not both" in both.stderr
        token_file.chmod(0o644)
        status = bare.lumos("status", "--address", address, "--token-file", str(token_file), "--json")
        assert "readable by other users" in status.stderr and "chmod 600" in status.stderr
        missing = bare.lumos("status", "--address", address, "--token-file", str(tmp_path / "nope"), check=False)
        assert missing.returncode == 1 and "cannot read the token file" in missing.stderr
    finally:
        bare.cleanup()

    procs, records = cli.processes(), cli.records()
    assert len(records) == 2
    cli.lumos("stop")
    assert_all_gone(procs, records)
    assert not os.path.exists(os.path.join(cli.root, "current_cluster.json"))

