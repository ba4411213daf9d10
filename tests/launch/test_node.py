"""``python -m lumos.launch.node``: the foreground node that Slurm steps and containers run.

Its normal life (start, join, SIGTERM) is exercised by test_slurm.py and test_kubernetes.py;
here, how it refuses to start.
"""

from __future__ import annotations

import os
import subprocess
import sys

from lumos.launch.kubernetes import new_token


def test_node_refuses_a_session_root_others_can_write_and_says_why(short_root: str) -> None:
    token = os.path.join(short_root, "token")
    with open(token, "w") as f:
        f.write(new_token())
    os.chmod(token, 0o600)
    shared = os.path.join(short_root, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    out = subprocess.run([sys.executable, "-m", "lumos.launch.node", "--head", "--port", "0", "--token-file", token,
                          "--node-ip-address", "127.0.0.1", "--no-dashboard"],
                         env={**os.environ, "LUMOS_TMPDIR": shared}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "has mode 777, not 700" in out.stderr, out.stderr
    assert not os.listdir(shared)
