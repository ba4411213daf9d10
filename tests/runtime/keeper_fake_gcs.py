"""A stand-in for the GCS process, for ``test_gcs_keeper.py``: each start follows the next
step of a plan file and logs its arguments, so the keeper's restarts can be checked
without a cluster.

Run as ``python -m tests.runtime.keeper_fake_gcs --plan PLAN --port N --ready-fd FD``.
The plan is a JSON list; each start takes (and removes) its first step:
``{"ready": bool, "exit": int | "SIGKILL", "after": seconds}``: report ready (port
4321) or not, then after ``after`` seconds exit with that status or SIGKILL itself.
With no step left it reports ready and runs until SIGTERM, then exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from lumos._private.process import report_ready


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--plan", required=True)
    p.add_argument("--port", default="0")
    p.add_argument("--ready-fd", type=int, default=-1)
    args = p.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    step = plan.pop(0) if plan else None
    with open(args.plan + ".tmp", "w") as f:
        json.dump(plan, f)
    os.replace(args.plan + ".tmp", args.plan)
    with open(args.plan + ".starts", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "port": args.port}) + "\n")
    if step is None:
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        report_ready(args.ready_fd, {"host": "127.0.0.1", "port": 4321, "pid": os.getpid()})
        while True:
            time.sleep(1)
    if step.get("ready"):
        report_ready(args.ready_fd, {"host": "127.0.0.1", "port": 4321, "pid": os.getpid()})
    time.sleep(float(step.get("after", 0)))
    if step["exit"] == "SIGKILL":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(step["exit"]))


if __name__ == "__main__":
    main()
