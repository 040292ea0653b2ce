"""A real torch.distributed job profiled by torch.profiler, for tests and benchmarks of the Kineto reader.

Each of ``ranks`` processes (gloo, CPU) runs ``steps`` profiled steps: a little
compute, then an all-to-all with every rank. ``faults`` maps ``"step:rank"``
to ``sleep`` (the rank sleeps 80 ms before the all-to-all: it arrives late) or
``compute`` (it computes about a hundred times longer). ``ops`` more small ops
per step make bigger traces. Each rank writes ``rank<r>.json``. Needs torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

JOB = """
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule


def rank_main(rank, world, out, steps, faults, ops):
    # a file rendezvous: no port to pick, so none another job on the host can take first
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "rendezvous"), rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    x = torch.randn(64, 64)
    active = schedule(wait=0, warmup=1, active=steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=active) as prof:
        for step in range(steps + 1):  # step 0 warms up; ProfilerStep#k is iteration k
            for _ in range(ops):
                x = torch.tanh(x @ x)
            fault = faults.get(f"{step}:{rank}")
            if fault == "sleep":
                time.sleep(0.08)
            elif fault == "compute":
                big = torch.randn(384, 384)
                for _ in range(60):
                    big = torch.tanh(big @ big)
            send = torch.full((world * 4,), float(rank))
            received = torch.empty_like(send)
            dist.all_to_all_single(received, send)
            prof.step()
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    out, steps, faults = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    world, ops = int(sys.argv[4]), int(sys.argv[5])
    mp.spawn(rank_main, args=(world, out, steps, faults, ops), nprocs=world)
"""


def run_job(out: Path, *, ranks: int, steps: int, faults: dict[str, str], ops: int = 3, timeout: float = 600) -> list[Path]:
    """Run the job (its script written beside the traces) and return the per-rank trace files."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / "job.py"
    script.write_text(JOB)
    (out / "rendezvous").unlink(missing_ok=True)  # the file store must start empty
    command = [sys.executable, str(script), str(out), str(steps), json.dumps(faults), str(ranks), str(ops)]
    done = subprocess.run(command, check=False, timeout=timeout, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the Kineto job failed ({done.returncode}): {done.stderr[-3000:]}")
    script.unlink()
    (out / "rendezvous").unlink(missing_ok=True)
    return sorted(out.glob("rank*.json"))
