"""DistributedWorker: a rank's device memory (malloc/free) and host<->device copies.

Copies address memory by the *allocation base* that ``malloc`` returned: the
worker reconstructs the owning allocation (size, dtype-free bytes) from the
base, so a copy can never run past its allocation. An interior pointer is
rejected instead of being silently treated as a new base (copying an MTP pool
from inside a neighbouring pool was exactly that bug).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

_ALIGN = 64


@dataclass(frozen=True)
class Allocation:
    base: int
    nbytes: int
    tag: str
    storage: torch.Tensor  # uint8 device buffer of nbytes


class DistributedWorker:
    """Device memory of one rank, on its device (CPU executor or CUDA)."""

    def __init__(self, rank: int, device):
        self.rank = rank
        self.device = device
        self._by_base: dict[int, Allocation] = {}
        self._bases: list[int] = []  # sorted, for locating interior pointers

    def malloc(self, nbytes: int, tag: str = "") -> int:
        """Allocate ``nbytes`` of device memory; returns the allocation base address."""
        if nbytes <= 0:
            raise ValueError(f"malloc size must be positive, got {nbytes}")
        padded = -(-nbytes // _ALIGN) * _ALIGN
        storage = torch.zeros(padded, dtype=torch.uint8, device=self.device.torch_device)
        base = storage.data_ptr()
        self._by_base[base] = Allocation(base, nbytes, tag, storage)
        bisect.insort(self._bases, base)
        return base

    def free(self, base: int) -> None:
        alloc = self._allocation(base, "free")
        del self._by_base[alloc.base]
        self._bases.remove(alloc.base)

    def _allocation(self, address: int, op: str) -> Allocation:
        alloc = self._by_base.get(address)
        if alloc is not None:
            return alloc
        index = bisect.bisect_right(self._bases, address) - 1
        if index >= 0:
            owner = self._by_base[self._bases[index]]
            if address < owner.base + owner.nbytes:
                raise ValueError(
                    f"{op} needs the allocation base returned by malloc: 0x{address:x} is "
                    f"{address - owner.base} bytes inside the allocation at base 0x{owner.base:x} "
                    f"({owner.tag or 'untagged'}, {owner.nbytes} bytes) on rank {self.rank}"
                )
        raise ValueError(f"{op}: 0x{address:x} is not a device allocation of rank {self.rank}")

    def view(self, base: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """The allocation as a typed device tensor (what device programs read and write)."""
        alloc = self._allocation(base, "view")
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if nbytes > alloc.nbytes:
            raise ValueError(f"view of {nbytes} bytes exceeds the {alloc.nbytes}-byte allocation 0x{base:x}")
        return alloc.storage[:nbytes].view(dtype).view(shape)

    def copy_to(self, base: int, src: torch.Tensor) -> None:
        """Copy a host tensor into the allocation at ``base`` (synchronous, ordered on the stream)."""
        alloc = self._allocation(base, "copy_to")
        data = src.detach().contiguous().reshape(-1).view(torch.uint8)
        if data.numel() > alloc.nbytes:
            raise ValueError(f"copy_to of {data.numel()} bytes overruns the {alloc.nbytes}-byte allocation 0x{base:x}")
        self.device.copy_to_device(alloc.storage[: data.numel()], data)

    def copy_from(self, base: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A host copy of the allocation at ``base`` read as ``dtype``/``shape``."""
        self._allocation(base, "copy_from")
        return self.device.copy_from_device(self.view(base, dtype, shape))

    def allocations(self) -> int:
        return len(self._by_base)
