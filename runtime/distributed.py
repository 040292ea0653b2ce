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
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dsprof.errors import DsprofError
from dsprof.profiler.strace_format import A2A_WAIT, ALLREDUCE_WAIT, PEER_ATTR
from dsprof.runtime.device import device_wait, running_on_cuda

_STAMP_BYTES = 8  # one int64 arrival stamp (CLOCK_MONOTONIC ns: one clock for every rank of a host)


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
    wait_group: Any = None  # host-side gloo group exchanging wait lengths after each run; None: stamps

    @property
    def stamps_arrivals(self) -> bool:
        """Whether the collectives carry arrival stamps (else the waits are exchanged after the run)."""
        return self.wait_group is None

    def exchange_waits(self, waits: list[tuple[str, int]]) -> WaitExchange:
        """Start exchanging a run's collective waits (span name, length ns; in program order, the same on every rank)."""
        return WaitExchange(self, waits)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp

    def all_reduce_tp(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the TP group; inside a device program it is timed as an ``allreduce_wait`` phase.

        A sum cannot carry the arrival stamps, so they follow in one small int64 all-gather
        (everyone has arrived by then: it costs a round trip, not a wait).
        """
        if self.tp > 1:
            with device_wait(ALLREDUCE_WAIT) as attrs:
                arrived_ns = time.monotonic_ns()
                dist.all_reduce(tensor, group=self.tp_group)
                if self.stamps_arrivals and not running_on_cuda():
                    stamps = [torch.zeros(1, dtype=torch.int64) for _ in range(self.tp)]
                    dist.all_gather(stamps, torch.tensor([arrived_ns], dtype=torch.int64), group=self.tp_group)
                    attrs[PEER_ATTR] = self.rank - self.tp_rank + last_arrival([int(stamp) for stamp in stamps])
        return tensor

    def wait_global_predecessor(self) -> None:
        """Block until every rank has reached this point (the previous dispatch drained everywhere)."""
        dist.barrier(group=self.metadata_group)

    def all_to_all(self, send: torch.Tensor) -> torch.Tensor:
        """Equal-split all-to-all over every rank (the EP dispatch/combine), timed as an ``a2a_wait`` phase.

        The call returns when the slowest peer has sent its share, so its length
        on a rank that was on time is how long it waited for the others.
        """
        with device_wait(A2A_WAIT) as attrs:
            if not self.stamps_arrivals or running_on_cuda():  # on CUDA a host stamp says when the host enqueued
                recv = torch.empty_like(send)
                dist.all_to_all_single(recv, send)
                return recv
            recv, stamps = self._all_to_all_stamped(send, time.monotonic_ns())
            attrs[PEER_ATTR] = last_arrival(stamps)
        return recv

    def _all_to_all_stamped(self, send: torch.Tensor, arrived_ns: int) -> tuple[torch.Tensor, list[int]]:
        """The all-to-all with this rank's arrival stamp appended to every share: (received, each source's stamp).

        The stamp travels in the payload (as bytes after each destination's rows), so
        knowing who arrived last costs no extra collective.
        """
        world = self.world
        payload = send.contiguous().view(world, -1).view(torch.uint8)
        stamp = torch.tensor([arrived_ns], dtype=torch.int64).view(torch.uint8).expand(world, _STAMP_BYTES)
        combined = torch.cat([payload, stamp.to(payload.device)], dim=1)
        received = torch.empty_like(combined)
        dist.all_to_all_single(received, combined)
        recv = received[:, :-_STAMP_BYTES].contiguous().view(send.dtype).view(send.shape)
        stamps = received[:, -_STAMP_BYTES:].contiguous().view(torch.int64).flatten().tolist()
        return recv, stamps


class WaitExchange:
    """The ``peer`` of each collective wait of one run, from every rank's wait lengths (CUDA).

    The last rank to reach a collective is the one that waited least there: the
    others' waits all end when it arrives. The lengths are all-gathered on a host
    gloo group, asynchronously: the host thread never waits for its peers here.
    """

    def __init__(self, par: ParallelContext, waits: list[tuple[str, int]]):
        self.par, self.names = par, [name for name, _ in waits]
        self.gathered = [torch.zeros(len(waits), dtype=torch.int64) for _ in range(par.world)]
        mine = torch.tensor([length for _, length in waits], dtype=torch.int64)
        self.work = dist.all_gather(self.gathered, mine, group=par.wait_group, async_op=True) if waits else None

    def ready(self) -> bool:
        return self.work is None or self.work.is_completed()

    def peers(self) -> list[int]:
        """The peer of each wait, in order: the rank that waited least (of the TP group, for an all-reduce)."""
        if self.work is not None:
            self.work.wait()
        group = range(self.par.rank - self.par.tp_rank, self.par.rank - self.par.tp_rank + self.par.tp)
        found = []
        for index, name in enumerate(self.names):
            ranks = group if name.endswith(ALLREDUCE_WAIT) else range(self.par.world)
            found.append(ranks[last_arrival([-int(self.gathered[rank][index]) for rank in ranks])])
        return found


def last_arrival(stamps: list[int]) -> int:
    """Index of the latest arrival stamp; a tie goes to the lowest index (the ``peer`` attribute, docs/FORMATS.md "Host evidence")."""
    return max(range(len(stamps)), key=lambda index: (stamps[index], -index))


def init_distributed(
    rank: int,
    world: int,
    tp: int,
    master_addr: str,
    master_port: int,
    timeout_s: float = 120.0,
    metadata_group: bool = False,
    peer_source: str = "auto",
) -> ParallelContext:
    """Join the process group; ``metadata_group`` adds a separate host-side gloo group
    (the device-resident metadata path synchronises its updates over it, from the
    host thread, while the device stream owns the default group); ``peer_source``
    "waits" (CUDA's default) adds one for the exchange of wait lengths."""
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
    by_waits = peer_source == "waits" or (peer_source == "auto" and backend == "nccl")
    waits = dist.new_group(backend="gloo") if by_waits else None
    return ParallelContext(rank, world, tp, backend, tp_group, meta, waits)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
