"""A small DeepSeek-style MoE decoder with MLA-style latent KV and an MTP-1 head.

Weights are random but seeded, built in code identically on every rank; each
rank keeps its TP shard of attention / dense FFN / shared expert and its EP
share of the routed experts. Parameters live in device pools (one per module)
allocated through the DistributedWorker and filled with ``copy_to`` from each
pool's own allocation base.

Shapes: tokens ``[B, T]`` (B requests of this rank, T = 2 in decode: last
accepted token + MTP draft; T = prompt length in prefill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dsprof.runtime.config import RuntimeConfig
from dsprof.runtime.distributed import ParallelContext
from dsprof.runtime.worker import DistributedWorker


def rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


class ParamPool:
    """Parameters of one module packed in one device allocation."""

    def __init__(self, worker: DistributedWorker, name: str, params: dict[str, torch.Tensor]):
        flat = torch.cat([p.reshape(-1) for p in params.values()]).to(torch.float32)
        self.name = name
        self.base = worker.malloc(flat.numel() * 4, tag=name)
        worker.copy_to(self.base, flat)  # from this pool's own allocation base
        storage = worker.view(self.base, torch.float32, (flat.numel(),))
        self.tensors: dict[str, torch.Tensor] = {}
        offset = 0
        for key, value in params.items():
            self.tensors[key] = storage[offset : offset + value.numel()].view(value.shape)
            offset += value.numel()

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]


def _init(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) / math.sqrt(shape[0])


@dataclass
class ModelShape:
    hidden: int
    heads: int
    head_dim: int
    latent: int
    vocab: int
    experts: int
    experts_per_rank: int
    top_k: int
    ffn: int
    block_size: int
    dense_layers: int
    layers: int


class DeepSeekLite:
    """The rank-local shard of the model, with its forward passes."""

    def __init__(self, config: RuntimeConfig, par: ParallelContext, worker: DistributedWorker):
        self.par = par
        heads = config.heads
        self.shape = ModelShape(
            hidden=config.hidden,
            heads=heads,
            head_dim=config.hidden // heads,
            latent=config.kv_latent,
            vocab=config.vocab,
            experts=config.experts_per_rank * config.ranks,
            experts_per_rank=config.experts_per_rank,
            top_k=config.top_k,
            ffn=config.expert_hidden,
            block_size=config.block_size,
            dense_layers=config.dense_layers,
            layers=config.layers,
        )
        s = self.shape
        tp, tpr = par.tp, par.tp_rank
        self.local_heads = heads // tp
        hd_l = self.local_heads * s.head_dim

        def cols(w: torch.Tensor, width: int) -> torch.Tensor:
            return w[:, tpr * width : (tpr + 1) * width]

        def rows(w: torch.Tensor, height: int) -> torch.Tensor:
            return w[tpr * height : (tpr + 1) * height]

        gen = torch.Generator().manual_seed(config.seed * 7919 + 17)
        self.embed = ParamPool(worker, "embed", {"w": torch.randn(s.vocab, s.hidden, generator=gen)})
        self.lm_head = ParamPool(worker, "lm_head", {"w": _init(gen, s.hidden, s.vocab)})
        self.attn: list[ParamPool] = []
        self.ffn: list[ParamPool] = []
        self.experts: list[list[ParamPool]] = []
        for layer in range(s.layers):
            full = s.heads * s.head_dim
            self.attn.append(
                ParamPool(
                    worker,
                    f"layer{layer}.attn",
                    {
                        "wq": cols(_init(gen, s.hidden, full), hd_l),
                        "w_dkv": _init(gen, s.hidden, s.latent),
                        "w_uk": cols(_init(gen, s.latent, full), hd_l),
                        "w_uv": cols(_init(gen, s.latent, full), hd_l),
                        "wo": rows(_init(gen, full, s.hidden), hd_l),
                    },
                )
            )
            width = 2 * s.ffn if layer < s.dense_layers else s.ffn  # dense FFN, or the shared expert
            params = {"w1": cols(_init(gen, s.hidden, width), width // tp), "w2": rows(_init(gen, width, s.hidden), width // tp)}
            if layer >= s.dense_layers:
                params["router"] = _init(gen, s.hidden, s.experts)
            self.ffn.append(ParamPool(worker, f"layer{layer}.ffn", params))
            local: list[ParamPool] = []
            if layer >= s.dense_layers:
                for e in range(par.rank * s.experts_per_rank, (par.rank + 1) * s.experts_per_rank):
                    egen = torch.Generator().manual_seed(config.seed * 104729 + layer * 1009 + e)
                    local.append(
                        ParamPool(
                            worker, f"layer{layer}.expert{e}", {"w1": _init(egen, s.hidden, s.ffn), "w2": _init(egen, s.ffn, s.hidden)}
                        )
                    )
            self.experts.append(local)
        # MTP-1 module (replicated): its own pools, each copied from its own base.
        self.mtp_proj = ParamPool(worker, "mtp.proj", {"w": _init(gen, 2 * s.hidden, s.hidden)})
        self.mtp_ffn = ParamPool(worker, "mtp.ffn", {"w1": _init(gen, s.hidden, s.ffn), "w2": _init(gen, s.ffn, s.hidden)})

    # -- building blocks ------------------------------------------------------------------

    def attention(
        self, x: torch.Tensor, layer: int, positions: torch.Tensor, slots: torch.Tensor, ctx_slots: torch.Tensor, kv_pool: torch.Tensor
    ) -> torch.Tensor:
        """MLA-style attention: cache the compressed latent, up-project K/V from it.

        The K/V up-projections are absorbed into the query and the output (as MLA
        does in decode), so attention runs directly on the cached latents.
        ``positions`` [B, T] of the new tokens, ``slots`` [B, T] their cache
        slots, ``ctx_slots`` [B, L] cache slots of context positions 0..L-1.
        """
        s, p = self.shape, self.attn[layer]
        B, T, _ = x.shape
        hl, hd = self.local_heads, s.head_dim
        q = (x @ p["wq"]).view(B, T, hl, hd)
        latent = x @ p["w_dkv"]
        kv_pool.index_copy_(0, slots.reshape(-1), latent.reshape(-1, s.latent))
        ctx = kv_pool[ctx_slots]  # [B, L, latent]
        L = ctx.shape[1]
        q_latent = torch.einsum("bthd,lhd->bthl", q, p["w_uk"].view(s.latent, hl, hd))
        scores = torch.einsum("bthl,bsl->bhts", q_latent, ctx) / math.sqrt(hd)
        allowed = torch.arange(L, device=x.device).view(1, 1, L) <= positions.view(B, T, 1)
        scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        out_latent = torch.einsum("bhts,bsl->bthl", scores.softmax(-1), ctx)
        out = torch.einsum("bthl,lhd->bthd", out_latent, p["w_uv"].view(s.latent, hl, hd)).reshape(B, T, hl * hd)
        return self.par.all_reduce_tp(out @ p["wo"])

    def dense(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        p = self.ffn[layer]
        return self.par.all_reduce_tp(F.silu(x @ p["w1"]) @ p["w2"])

    def moe(self, x: torch.Tensor, layer: int, token_capacity: int) -> torch.Tensor:
        """Routed experts over EP (all-to-all dispatch and combine) plus the shared expert.

        Every rank sends a fixed ``token_capacity * top_k`` rows to every rank
        (unused rows carry expert id -1), so the all-to-all splits are equal and
        no count exchange is needed. Under TP each rank routes its slice of the
        replicated tokens; one TP all-reduce then merges the slices with the
        shared expert's partial sums.
        """
        s, p, par = self.shape, self.ffn[layer], self.par
        B, T, H = x.shape
        flat = x.reshape(-1, H)
        n = flat.shape[0]
        per = token_capacity  # tokens this rank routes (padded, equal on every rank)
        padded = torch.zeros(per * par.tp, H, dtype=flat.dtype, device=flat.device)
        padded[:n] = flat
        mine = padded[par.tp_rank * per : (par.tp_rank + 1) * per]
        real = (torch.arange(per, device=flat.device) + par.tp_rank * per) < n
        gate = (mine @ p["router"]).softmax(-1)
        weights, experts = gate.topk(s.top_k, dim=-1)  # [per, k]
        weights = weights / weights.sum(-1, keepdim=True)
        cap = per * s.top_k
        dest = (experts // s.experts_per_rank).reshape(-1)
        slot = torch.arange(cap, device=flat.device)
        send = torch.zeros(par.world, cap, H + 1, dtype=flat.dtype, device=flat.device)
        send[:, :, H] = -1.0
        valid = real.repeat_interleave(s.top_k)
        token_of = torch.arange(per, device=flat.device).repeat_interleave(s.top_k)
        send[dest[valid], slot[valid], :H] = mine[token_of[valid]]
        send[dest[valid], slot[valid], H] = (experts.reshape(-1)[valid] % s.experts_per_rank).to(flat.dtype)
        recv = par.all_to_all(send.reshape(par.world * cap, H + 1))
        expert_id = recv[:, H]
        result = torch.zeros(par.world * cap, H, dtype=flat.dtype, device=flat.device)
        for e, pool in enumerate(self.experts[layer]):
            rows = (expert_id == e).nonzero().squeeze(1)
            if rows.numel():
                result[rows] = F.silu(recv[rows, :H] @ pool["w1"]) @ pool["w2"]
        back = par.all_to_all(result).view(par.world, cap, H)
        gathered = back[dest, slot] * weights.reshape(-1, 1) * valid.unsqueeze(1)
        routed = gathered.view(per, s.top_k, H).sum(1)
        shared = F.silu(padded @ p["w1"]) @ p["w2"]  # TP partial sums of the shared expert
        shared[par.tp_rank * per : (par.tp_rank + 1) * per] += routed
        return par.all_reduce_tp(shared)[:n].view(B, T, H)

    def mtp_draft(self, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """MTP-1: draft the token after ``next_tokens`` from the target's last hidden state."""
        emb = self.embed["w"][next_tokens]
        z = torch.cat([rms_norm(hidden), rms_norm(emb)], -1) @ self.mtp_proj["w"]
        z = z + F.silu(rms_norm(z) @ self.mtp_ffn["w1"]) @ self.mtp_ffn["w2"]
        return (rms_norm(z) @ self.lm_head["w"]).argmax(-1)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        ctx_slots: torch.Tensor,
        kv_pools: list[torch.Tensor],
        token_capacity: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Target model over ``tokens`` [B, T]; returns (final hidden [B,T,H], logits [B,T,V])."""
        h = self.embed["w"][tokens]
        for layer in range(self.shape.layers):
            h = h + self.attention(rms_norm(h), layer, positions, slots, ctx_slots, kv_pools[layer])
            if layer < self.shape.dense_layers:
                h = h + self.dense(rms_norm(h), layer)
            else:
                h = h + self.moe(rms_norm(h), layer, token_capacity)
        h = rms_norm(h)
        return h, h @ self.lm_head["w"]
