"""Rank processes joined by torch.distributed (gloo on CPU, NCCL on CUDA).

Rendezvous is on loopback with a free port by default; under torchrun the
standard RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT variables are used.
Rank layout: ``tp`` consecutive ranks form one TP group (one DP replica);
experts are sharded over all ranks (EP = world size).
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dsprof.errors import DsprofError
from dsprof.profiler.strace_format import A2A_WAIT, ALLREDUCE_WAIT
from dsprof.runtime.device import device_wait


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_env() -> tuple[int, int] | None:
    """(rank, world size) when launched by torchrun (or any launcher setting RANK/WORLD_SIZE)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except ValueError:
            raise DsprofError("RANK and WORLD_SIZE must be integers") from None
    return None


@dataclass
class ParallelContext:
    rank: int
    world: int
    tp: int
    backend: str
    tp_group: Any  # a torch.distributed ProcessGroup; None when tp == 1
    metadata_group: Any = None  # host-side group of the device-resident metadata path

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    def all_reduce_tp(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the TP group; inside a device program it is timed as an ``allreduce_wait`` phase."""
        if self.tp > 1:
            with device_wait(ALLREDUCE_WAIT):
                dist.all_reduce(tensor, group=self.tp_group)
        return tensor

    def wait_global_predecessor(self) -> None:
        """Block until every rank has reached this point (the previous dispatch drained everywhere)."""
        dist.barrier(group=self.metadata_group)

    def all_to_all(self, send: torch.Tensor) -> torch.Tensor:
        """Equal-split all-to-all over every rank (the EP dispatch/combine), timed as an ``a2a_wait`` phase.

        The call returns when the slowest peer has sent its share, so its length
        on a rank that was on time is how long it waited for the others.
        """
        recv = torch.empty_like(send)
        with device_wait(A2A_WAIT):
            dist.all_to_all_single(recv, send)
        return recv


def init_distributed(
    rank: int, world: int, tp: int, master_addr: str, master_port: int, timeout_s: float = 120.0, metadata_group: bool = False
) -> ParallelContext:
    """Join the process group; ``metadata_group`` adds a separate host-side gloo group
    (the device-resident metadata path synchronises its updates over it, from the
    host thread, while the device stream owns the default group)."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    os.environ.setdefault("MASTER_ADDR", master_addr)
    os.environ.setdefault("MASTER_PORT", str(master_port))
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world,
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    tp_group = None
    if tp == world and tp > 1:
        tp_group = dist.group.WORLD
    elif tp > 1:
        for first in range(0, world, tp):  # every rank creates every group, in the same order
            group = dist.new_group(list(range(first, first + tp)))
            if first <= rank < first + tp:
                tp_group = group
    meta = dist.new_group(backend="gloo") if metadata_group else None
    return ParallelContext(rank, world, tp, backend, tp_group, meta)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
