"""Paged KV cache of one rank: latent pools per layer, block allocator, block metadata.

Block 0 is the null block: rows of finished requests write there, and unused
block-table entries point there, so the fused program needs no branches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsprof.runtime.worker import DistributedWorker

NULL_BLOCK = 0


@dataclass
class BlockMetadata:
    """Per-step block metadata of a batch (host tensors, staged into a TaskArgs slot)."""

    block_table: torch.Tensor  # [B, max_blocks_per_seq] int64
    seq_lens: torch.Tensor  # [B] int64, tokens in the cache after this step (worst case in decode)
    slot_mapping: torch.Tensor  # [B, T] int64, cache slots of this step's tokens (worst case)
    block_counts: torch.Tensor  # [B] int64
    max_blocks: int  # blocks the longest sequence spans (bounds the context gather)


class PagedKVCache:
    def __init__(self, worker: DistributedWorker, layers: int, batch: int, max_tokens_per_seq: int, block_size: int, latent: int):
        self.block_size = block_size
        self.max_blocks_per_seq = -(-max_tokens_per_seq // block_size)
        self.num_blocks = batch * self.max_blocks_per_seq + 1
        self.pools = []
        for layer in range(layers):
            base = worker.malloc(self.num_blocks * block_size * latent * 4, tag=f"kv.layer{layer}")
            self.pools.append(worker.view(base, torch.float32, (self.num_blocks * block_size, latent)))
        self._free = list(range(self.num_blocks - 1, NULL_BLOCK, -1))
        self.tables: list[list[int]] = [[] for _ in range(batch)]

    def ensure(self, index: int, tokens: int) -> None:
        """Make sequence ``index`` hold at least ``tokens`` positions (worst-case allocation)."""
        need = -(-tokens // self.block_size)
        if need > self.max_blocks_per_seq:
            raise RuntimeError(f"sequence {index} needs {need} blocks, more than {self.max_blocks_per_seq}")
        table = self.tables[index]
        while len(table) < need:
            table.append(self._free.pop())

    def release(self, index: int) -> None:
        self._free.extend(reversed(self.tables[index]))
        self.tables[index] = []

    def metadata(self, first_positions: list[int], tokens_per_seq: int, active: list[bool]) -> BlockMetadata:
        """Metadata for feeding ``tokens_per_seq`` tokens per sequence from ``first_positions``."""
        batch = len(first_positions)
        table = torch.zeros(batch, self.max_blocks_per_seq, dtype=torch.int64)
        counts = torch.zeros(batch, dtype=torch.int64)
        for i, blocks in enumerate(self.tables):
            table[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int64) if blocks else 0
            counts[i] = len(blocks)
        first = torch.tensor(first_positions, dtype=torch.int64)
        positions = first.unsqueeze(1) + torch.arange(tokens_per_seq)
        mask = torch.tensor(active, dtype=torch.bool)
        slots = slots_for(table, positions, self.block_size, mask)
        seq_lens = torch.where(mask, first + tokens_per_seq, torch.zeros_like(first))
        return BlockMetadata(table, seq_lens, slots, counts, max(1, int(counts.max())))


def slots_for(block_table: torch.Tensor, positions: torch.Tensor, block_size: int, active: torch.Tensor) -> torch.Tensor:
    """Cache slots of ``positions`` [B, T]; inactive rows map into the null block."""
    block_index = (positions // block_size).clamp(max=block_table.shape[1] - 1)
    blocks = block_table.gather(1, block_index)
    blocks = torch.where(active.unsqueeze(1), blocks, torch.full_like(blocks, NULL_BLOCK))
    return blocks * block_size + positions % block_size


def context_slots(block_table: torch.Tensor, max_blocks: int, block_size: int) -> torch.Tensor:
    """Cache slots of context positions 0 .. max_blocks*block_size-1 per sequence [B, L]."""
    blocks = block_table[:, :max_blocks]
    return (blocks.unsqueeze(2) * block_size + torch.arange(block_size, device=blocks.device)).reshape(blocks.shape[0], -1)
