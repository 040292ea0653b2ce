"""TaskArgs: the ordered, placement-aware argument list of one fused-program launch.

Each slot is either HOST_SHARED (a host shared-memory tensor owned by the
TaskArgs and handed to the program by reference: staging it is a plain write)
or DEVICE_RESIDENT (a device buffer from ``DistributedWorker.malloc``: staging
it is a synchronous copy outside the dispatch). The chip-run lane keeps one
TaskArgs per ping-pong slot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from dsprof.runtime.worker import DistributedWorker


class Placement(Enum):
    HOST_SHARED = "host_shared"
    DEVICE_RESIDENT = "device_resident"


@dataclass
class ArgSlot:
    name: str
    placement: Placement
    tensor: torch.Tensor  # what the program reads (host shared tensor or device view)
    base: int | None  # device allocation base (DEVICE_RESIDENT only)


class TaskArgs:
    """Ordered arguments of one ping-pong slot; ``generation`` counts its reuses."""

    def __init__(self, slot_id: int, worker: DistributedWorker, before_device_update: Callable[[], None] | None = None):
        """``before_device_update`` runs before every DEVICE_RESIDENT staging copy
        (the legacy path waits there for its global metadata predecessor)."""
        self.slot_id = slot_id
        self.worker = worker
        self.before_device_update = before_device_update
        self.generation = -1
        self._slots: dict[str, ArgSlot] = {}
        # Host scalars of the launch (e.g. how many cache blocks the longest sequence spans).
        self.scalars: dict[str, int] = {}
        # Prebuilt device objects bound by reference at bind time (KV pools, decode state).
        self.prebuilt: dict[str, Any] = {}  # KV pools (list of tensors), the decode state (dict of tensors)

    def add(self, name: str, placement: Placement, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        if name in self._slots:
            raise ValueError(f"TaskArgs slot {self.slot_id} already has an argument {name!r}")
        if placement is Placement.HOST_SHARED:
            tensor = torch.zeros(shape, dtype=dtype)
            # shared memory on the CPU device; page-locked for async reads by a CUDA device
            tensor = tensor.pin_memory() if self.worker.device.kind == "cuda" else tensor.share_memory_()
            base = None
        else:
            nbytes = max(1, torch.empty(shape, dtype=dtype).nbytes)
            base = self.worker.malloc(nbytes, tag=f"taskargs[{self.slot_id}].{name}")
            tensor = self.worker.view(base, dtype, shape)
        self._slots[name] = ArgSlot(name, placement, tensor, base)
        return tensor

    def stage(self, name: str, value: torch.Tensor) -> None:
        """Put a host value into the argument: in place (host-shared) or by device copy."""
        slot = self._slots[name]
        if slot.placement is Placement.HOST_SHARED:
            slot.tensor.copy_(value.reshape(slot.tensor.shape))
        else:
            if self.before_device_update is not None:
                self.before_device_update()
            self.worker.copy_to(self.base(name), value.to(slot.tensor.dtype))

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._slots[name].tensor

    def base(self, name: str) -> int:
        """Device allocation base of a DEVICE_RESIDENT argument."""
        base = self._slots[name].base
        if base is None:
            raise ValueError(f"argument {name!r} is host-shared: it has no device allocation")
        return base

    def names(self) -> list[str]:
        """Argument names in launch order."""
        return list(self._slots)
