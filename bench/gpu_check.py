"""GPU placement on a real GPU: what a user of ``num_gpus`` relies on, checked end to end.

    python bench/gpu_check.py            # on a machine with an NVIDIA GPU (and PyTorch)
    python bench/gpu_check.py --fake 1   # no GPU: declare one, check placement alone

CI has no GPU, so this is a script to run where one is (the tests cover the same
placement with declared GPUs). Each check prints PASS or FAIL and a line of evidence;
the exit status is the number of failures. Checks:

1. ``init()`` finds the machine's GPUs (``nvidia-smi -L``) as the ``GPU`` resource.
2. A ``num_gpus=1`` task sees ``get_gpu_ids() == [0]`` and ``CUDA_VISIBLE_DEVICES=0``,
   and PyTorch inside it runs a matrix product on that GPU.
3. A GPU task's worker exits after it (``max_calls`` defaults to 1 for GPU tasks, as in
   Ray), so the GPU memory it held is freed: the worker's pid is gone and
   ``nvidia-smi`` shows the memory back.
4. Four ``num_gpus=0.25`` tasks share the GPU at once; two ``num_gpus=1`` tasks never
   overlap.
5. A ``num_gpus=1`` actor keeps a CUDA tensor across calls, is listed as holding the GPU
   by the ``%lumos gpus`` panel's data (``lumos.kernelext.widgets.gpu_holders``), and
   a CUDA tensor it returns arrives on the GPU in the driver.
6. A placement group with a GPU bundle places a task on it.
7. A task needing more GPUs than the cluster has fails its ``get`` with a timeout
   rather than hanging, and says why in ``lumos.state``'s task row.
8. The panel reads the GPU's model and memory from ``nvidia-smi``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import lumos

FAILURES: list[str] = []


def check(name: str, ok: bool, evidence: Any) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {evidence}", flush=True)
    if not ok:
        FAILURES.append(name)


def smi_used_mib() -> float | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run([exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10)
    try:
        return float(out.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@lumos.remote(num_gpus=1)
def gpu_task(n: int) -> dict[str, Any]:
    info: dict[str, Any] = {"ids": lumos.get_gpu_ids(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "pid": os.getpid()}
    try:
        import torch
    except ImportError:
        return info
    info["torch_devices"] = torch.cuda.device_count()
    if torch.cuda.is_available() and n:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            c = a @ a
        torch.cuda.synchronize()
        info["tflops"] = 10 * 2 * n ** 3 / (time.perf_counter() - t0) / 1e12
        info["finite"] = bool(torch.isfinite(c.float()).all().item())
        info["device_name"] = torch.cuda.get_device_name(0)
    return info


@lumos.remote(num_gpus=1)
def hold_gpu_memory(gib: float) -> int:
    try:
        import torch
        if torch.cuda.is_available():
            x = torch.empty(int(gib * 2 ** 30), dtype=torch.uint8, device="cuda")
            x.fill_(1)
            torch.cuda.synchronize()
    except ImportError:
        pass
    return os.getpid()


@lumos.remote
def interval(hold_s: float) -> tuple[float, float, str | None, list[Any]]:
    t0 = time.time()
    try:
        import torch
        if torch.cuda.is_available():
            torch.ones(1, device="cuda").sum().item()  # a CUDA context on the shared GPU
    except ImportError:
        pass
    time.sleep(hold_s)
    return t0, time.time(), os.environ.get("CUDA_VISIBLE_DEVICES"), lumos.get_gpu_ids()


@lumos.remote(num_gpus=1)
class GpuHolder:
    def __init__(self) -> None:
        self.state: Any = None
        try:
            import torch
            if torch.cuda.is_available():
                self.state = torch.zeros(1024, device="cuda")
        except ImportError:
            pass

    def step(self) -> Any:
        if self.state is None:
            return None
        self.state += 1
        return float(self.state[0].item())

    def tensor(self) -> Any:
        return self.state

    def ids(self) -> list[Any]:
        return lumos.get_gpu_ids()


def overlapping(spans: list[tuple[float, float]]) -> bool:
    spans = sorted(spans)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fake", type=float, default=None, help="declare this many GPUs (no GPU needed)")
    p.add_argument("--matmul", type=int, default=8192, help="matrix size for the GPU task's product")
    args = p.parse_args()

    smi = shutil.which("nvidia-smi")
    listed = 0
    if smi:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
        listed = sum(1 for ln in out.stdout.splitlines() if ln.startswith("GPU "))
        print(out.stdout.strip())
    try:
        import torch
        real = torch.cuda.is_available() and args.fake is None
        print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}")
    except ImportError:
        real = False
        print("torch: not installed")
    if args.fake is None and not listed:
        print("no GPU here: run with --fake 1 to check placement with a declared GPU")
        return 2

    lumos.init(num_cpus=4, num_gpus=args.fake)
    try:
        gpus = lumos.cluster_resources().get("GPU", 0)
        check("1 init finds the GPUs", gpus == (args.fake if args.fake is not None else listed),
              f"cluster_resources GPU={gpus}, nvidia-smi lists {listed}")

        info = lumos.get(gpu_task.remote(args.matmul if real else 0), timeout=120)
        ok = info["ids"] == [0] and info["cvd"] == "0"
        if real:
            ok = ok and info.get("torch_devices") == 1 and info.get("finite", False)
        check("2 a num_gpus=1 task gets GPU 0", ok,
              {k: (round(v, 1) if isinstance(v, float) else v) for k, v in info.items() if k != "pid"})

        before = smi_used_mib()
        pid = lumos.get(hold_gpu_memory.remote(4.0), timeout=120)
        deadline = time.time() + 20
        while pid_alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        gone = not pid_alive(pid)
        time.sleep(0.5)
        after = smi_used_mib()
        freed = before is None or after is None or not real or after <= before + 256
        check("3 a GPU task's worker exits, freeing the GPU's memory", gone and freed,
              f"worker {pid} gone={gone}; nvidia-smi memory.used {before} MiB before, {after} MiB after "
              f"(the task held 4 GiB)")

        spans = lumos.get([interval.options(num_gpus=0.25).remote(1.5) for _ in range(4)], timeout=120)
        shared = all(s[2] == "0" and s[3] == [0] for s in spans)
        starts = [s[0] for s in spans]
        together = max(starts) < min(s[1] for s in spans)
        check("4a four num_gpus=0.25 tasks share GPU 0 at once", shared and together,
              f"start spread {max(starts) - min(starts):.2f}s, all ended after the last began: {together}; "
              f"CUDA_VISIBLE_DEVICES {[s[2] for s in spans]}")
        spans = lumos.get([interval.options(num_gpus=1).remote(1.0) for _ in range(2)], timeout=120)
        check("4b two num_gpus=1 tasks never overlap", not overlapping([(s[0], s[1]) for s in spans]),
              [f"{s[0] - spans[0][0]:.2f}..{s[1] - spans[0][0]:.2f}" for s in spans])

        holder = GpuHolder.remote()
        steps = [lumos.get(holder.step.remote(), timeout=120) for _ in range(3)]
        ids = lumos.get(holder.ids.remote(), timeout=60)
        from lumos.kernelext.widgets import gpu_holders, local_gpu_models
        deadline = time.time() + 10
        held: dict[str, Any] = {}
        while time.time() < deadline:
            held = gpu_holders()
            if any(h["kind"] == "actor" for rows in held.values() for h in rows):
                break
            time.sleep(0.2)
        listed_actor = any(h["kind"] == "actor" and h["name"] == "GpuHolder" for rows in held.values() for h in rows)
        ok = ids == [0] and listed_actor and (steps == [1.0, 2.0, 3.0] if real else True)
        check("5a a num_gpus=1 actor keeps its CUDA state and shows in the panel", ok,
              f"steps {steps}, ids {ids}, panel holders {held}")
        if real:
            t = lumos.get(holder.tensor.remote(), timeout=60)
            check("5b a CUDA tensor an actor returns arrives on the GPU", str(t.device).startswith("cuda")
                  and float(t[0].item()) == 3.0, f"device {t.device}, value {float(t[0].item())}")
        lumos.kill(holder)

        pg = lumos.util.placement_group([{"CPU": 1, "GPU": 1}])
        lumos.get(pg.ready(), timeout=60)
        strategy = lumos.util.scheduling_strategies.PlacementGroupSchedulingStrategy(pg, 0)
        s = lumos.get(interval.options(num_gpus=1, scheduling_strategy=strategy).remote(0.0), timeout=60)
        check("6 a placement group's GPU bundle places a task", s[2] == "0" and s[3] == [0],
              f"CUDA_VISIBLE_DEVICES={s[2]} ids={s[3]}")
        lumos.util.remove_placement_group(pg)

        too_many = interval.options(num_gpus=gpus + 1).remote(0.0)
        t0 = time.time()
        try:
            lumos.get(too_many, timeout=3)
            outcome = "returned"
        except lumos.exceptions.GetTimeoutError:
            outcome = "GetTimeoutError"
        except lumos.exceptions.LumosError as e:
            outcome = type(e).__name__
        waited = time.time() - t0
        rows = lumos.state.list_tasks(filters=[("name", "=", "interval")], limit=100)
        pending = [r for r in rows if r.get("required_resources", {}).get("GPU") == gpus + 1]
        check("7 a task needing more GPUs than exist does not hang get()",
              outcome in ("GetTimeoutError", "TaskUnschedulableError") and waited < 10,
              f"{outcome} after {waited:.1f}s; task row state {[r.get('state') for r in pending]}")
        lumos.cancel(too_many)

        models = local_gpu_models()
        ok = bool(models) and models[0]["memory_total_mib"] > 0 if listed else models == []
        check("8 the panel reads the GPU model and memory", ok, models)
    finally:
        lumos.shutdown()
    print(f"{len(FAILURES)} failed" + (f": {', '.join(FAILURES)}" if FAILURES else ""))
    return len(FAILURES)


if __name__ == "__main__":
    sys.exit(main())
