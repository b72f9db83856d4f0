"""A GPT-style transformer stage built from a ModelSpec, Megatron-style tensor parallel.

Column-parallel input projections and row-parallel output projections over the stage's TP
group (query heads and FFN width split over ``tp``; KV heads read by several ranks are held by
each of them), a vocabulary-parallel output head and cross-entropy, and MoE blocks with top-k
routing whose experts are sharded over an EP group and reached with all-to-all. With no groups
(``tp = ep = 1``) the same code is the single-process reference model.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from arachne.runtime.layout import (
    ParamSpec,
    attention_heads,
    block_specs,
    embedding_specs,
    head_specs,
    head_weight_name,
    local_experts,
    split_range,
)
from arachne.spec.model import ModelSpec

INIT_STD = 0.02


@dataclass(frozen=True)
class Comm:
    """A process group seen from one member: None when the group is just this process."""

    group: dist.ProcessGroup | None = None
    rank: int = 0
    size: int = 1


LOCAL = Comm()


# ---- autograd-aware collectives ------------------------------------------------------------------
class _CopyToTP(torch.autograd.Function):
    """Identity forward, all-reduce of the input gradient backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup) -> Tensor:  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        g = grad.contiguous().clone()
        if g.numel():
            dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward (sum of row-parallel partial outputs), identity backward (``g``)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup) -> Tensor:  # type: ignore[override]
        out = x.contiguous().clone()
        if out.numel():
            dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad, None


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward sends gradients back the same way."""

    @staticmethod
    def forward(ctx, x: Tensor, out_splits: list[int], in_splits: list[int],  # type: ignore[override]
                group: dist.ProcessGroup) -> Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        g = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(g, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return g, None, None, None


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy of logits split over the vocabulary across a TP group."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, lo: int,  # type: ignore[override]
                group: dist.ProcessGroup) -> Tensor:
        logits = logits.float()
        m = logits.max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        z = logits - m.unsqueeze(-1)
        e = z.exp()
        s = e.sum(dim=-1)
        dist.all_reduce(s, group=group)
        inside = (target >= lo) & (target < lo + logits.shape[-1])
        local = (target - lo).clamp(0, logits.shape[-1] - 1)
        t = z.gather(-1, local.unsqueeze(-1)).squeeze(-1) * inside
        dist.all_reduce(t, group=group)
        ctx.save_for_backward(e / s.unsqueeze(-1), local, inside)
        return s.log() - t

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None, None]:  # type: ignore[override]
        probs, local, inside = ctx.saved_tensors
        g = probs.clone()
        g.scatter_add_(-1, local.unsqueeze(-1), -inside.to(g.dtype).unsqueeze(-1))
        return g * grad.unsqueeze(-1), None, None, None


def copy_to_tp(x: Tensor, tp: Comm) -> Tensor:
    return x if tp.group is None else _CopyToTP.apply(x, tp.group)


def reduce_from_tp(x: Tensor, tp: Comm) -> Tensor:
    return x if tp.group is None else _ReduceFromTP.apply(x, tp.group)


def all_to_all(x: Tensor, out_splits: list[int], in_splits: list[int], comm: Comm) -> Tensor:
    return _AllToAll.apply(x, out_splits, in_splits, comm.group)


# ---- parameters --------------------------------------------------------------------------------
def name_seed(seed: int, name: str) -> int:
    """A per-tensor seed: initial weights depend on the seed and the canonical name only."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


def init_full(spec: ParamSpec, seed: int, num_layers: int) -> Tensor:
    """The canonical (unsharded) initial value of a parameter, identical on every device."""
    if spec.init == "zeros":
        return torch.zeros(spec.shape)
    if spec.init == "ones":
        return torch.ones(spec.shape)
    g = torch.Generator().manual_seed(name_seed(seed, spec.name))
    std = INIT_STD / math.sqrt(2 * num_layers) if spec.init == "out" else INIT_STD
    return torch.randn(spec.shape, generator=g) * std


def shard(full: Tensor, spec: ParamSpec) -> Tensor:
    return full if spec.dim is None else full.narrow(spec.dim, spec.start, spec.stop - spec.start)


class ParamStore:
    """Creates a device's parameters from their specs and records (spec, parameter) pairs.

    ``source(name)`` returns a canonical tensor (from a checkpoint) or None to initialise from
    the seed. ``tie``: a second whole-tensor request for a name returns the same parameter (the
    single-process reference ties embedding and head this way; distributed runs keep separate
    pieces and sum their gradients instead).
    """

    def __init__(self, model: ModelSpec, seed: int, device: torch.device,
                 source: Callable[[str], Tensor | None] | None = None, tie: bool = False):
        self.model, self.seed, self.device, self.source, self.tie = model, seed, device, source, tie
        self.entries: list[tuple[ParamSpec, nn.Parameter]] = []
        self._whole: dict[str, nn.Parameter] = {}

    def make(self, spec: ParamSpec) -> nn.Parameter:
        whole = spec.dim is None or (spec.start == 0 and spec.stop == spec.shape[spec.dim])
        if self.tie and whole and spec.name in self._whole:
            return self._whole[spec.name]
        full = self.source(spec.name) if self.source else None
        if full is None:
            full = init_full(spec, self.seed, self.model.num_layers)
        if tuple(full.shape) != spec.shape:
            raise ValueError(f"{spec.name}: checkpoint shape {tuple(full.shape)} != model shape {spec.shape}")
        p = nn.Parameter(shard(full, spec).detach().to(self.device, torch.float32).clone())
        self.entries.append((spec, p))
        if whole:
            self._whole.setdefault(spec.name, p)
        return p


def _specs(specs: list[ParamSpec]) -> dict[str, ParamSpec]:
    return {s.name: s for s in specs}


# ---- layers ------------------------------------------------------------------------------------
class Norm(nn.Module):
    """LayerNorm (models with biases) or RMSNorm, replicated over the TP group."""

    def __init__(self, model: ModelSpec, prefix: str, specs: dict[str, ParamSpec], store: ParamStore):
        super().__init__()
        self.weight = store.make(specs[prefix + "weight"])
        self.bias = store.make(specs[prefix + "bias"]) if model.bias else None
        self.shape = (model.hidden_size,)

    def forward(self, x: Tensor) -> Tensor:
        if self.bias is not None:
            return F.layer_norm(x, self.shape, self.weight, self.bias, 1e-5)
        return F.rms_norm(x, self.shape, self.weight, 1e-5)


class MLP(nn.Module):
    """gelu or swiglu MLP: column-parallel in, row-parallel out."""

    def __init__(self, model: ModelSpec, prefix: str, specs: dict[str, ParamSpec], store: ParamStore, tp: Comm):
        super().__init__()
        self.tp, self.swiglu = tp, model.mlp == "swiglu"
        names = ("gate", "up", "down") if self.swiglu else ("fc1", None, "fc2")
        self.w_in = store.make(specs[f"{prefix}{names[0]}.weight"])
        self.b_in = store.make(specs[f"{prefix}{names[0]}.bias"]) if model.bias else None
        self.w_up = store.make(specs[f"{prefix}up.weight"]) if self.swiglu else None
        self.b_up = store.make(specs[f"{prefix}up.bias"]) if self.swiglu and model.bias else None
        self.w_out = store.make(specs[f"{prefix}{names[2]}.weight"])
        self.b_out = store.make(specs[f"{prefix}{names[2]}.bias"]) if model.bias else None

    def partial(self, x: Tensor) -> Tensor:
        """This rank's share of the output (before the TP sum and the output bias)."""
        h = F.linear(x, self.w_in, self.b_in)
        if self.swiglu:
            h = F.silu(h) * F.linear(x, self.w_up, self.b_up)
        else:
            h = F.gelu(h)
        return F.linear(h, self.w_out)

    def forward(self, x: Tensor) -> Tensor:
        y = reduce_from_tp(self.partial(copy_to_tp(x, self.tp)), self.tp)
        return y if self.b_out is None else y + self.b_out


def rope(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding (rotate-half form) on ``x`` [batch, heads, seq, head_dim]."""
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang, ang], -1).cos().to(x.dtype), torch.cat([ang, ang], -1).sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    """Causal self-attention with GQA; query heads split over TP, KV heads held where read."""

    def __init__(self, model: ModelSpec, prefix: str, specs: dict[str, ParamSpec], store: ParamStore, tp: Comm):
        super().__init__()
        self.tp, self.rope = tp, model.position_embedding == "rope"
        q_lo, q_hi, kv_lo, kv_hi = attention_heads(model, tp.size, tp.rank)
        self.heads, self.kv, self.hd = q_hi - q_lo, kv_hi - kv_lo, model.head_dim
        group = model.num_attention_heads // model.kv_heads
        kv_index = [(q_lo + j) // group - kv_lo for j in range(self.heads)]
        self.register_buffer("kv_index", torch.tensor(kv_index, device=store.device), persistent=False)
        b = model.bias
        self.wq, self.wk, self.wv, self.wo = (store.make(specs[f"{prefix}{n}.weight"]) for n in "qkvo")
        self.bq, self.bk, self.bv, self.bo = ((store.make(specs[f"{prefix}{n}.bias"]) if b else None) for n in "qkvo")

    def forward(self, x: Tensor) -> Tensor:
        bsz, s, _ = x.shape
        x = copy_to_tp(x, self.tp)
        q = F.linear(x, self.wq, self.bq).view(bsz, s, self.heads, self.hd).transpose(1, 2)
        k = F.linear(x, self.wk, self.bk).view(bsz, s, self.kv, self.hd).transpose(1, 2)
        v = F.linear(x, self.wv, self.bv).view(bsz, s, self.kv, self.hd).transpose(1, 2)
        if self.rope:
            q, k = rope(q), rope(k)
        if self.kv != self.heads:
            k, v = k.index_select(1, self.kv_index), v.index_select(1, self.kv_index)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(bsz, s, self.heads * self.hd)
        y = reduce_from_tp(F.linear(out, self.wo), self.tp)
        return y if self.bo is None else y + self.bo


class MoE(nn.Module):
    """Top-k routed experts, sharded over the EP group (all-to-all dispatch), dropless.

    Gates are the softmax probabilities of the chosen experts, renormalised when k > 1. The
    expert holder sums its TP ranks' partial outputs and adds the expert's output bias before
    sending results back, so every parameter has plain replica/partial gradient semantics.
    """

    def __init__(self, model: ModelSpec, prefix: str, specs: dict[str, ParamSpec], store: ParamStore,
                 tp: Comm, ep: Comm):
        super().__init__()
        self.tp, self.ep, self.k, self.E = tp, ep, model.experts_top_k, model.num_experts
        self.router = store.make(specs[prefix + "router.weight"])
        self.experts_ids = list(local_experts(model, ep.size, ep.rank))
        self.experts = nn.ModuleList(MLP(model, f"{prefix}experts.{e}.", specs, store, tp) for e in self.experts_ids)
        self.shared = MLP(model, prefix + "shared.", specs, store, tp) if model.num_shared_experts else None

    def _experts(self, x: Tensor, counts: list[int]) -> Tensor:
        """Run local expert j on the next ``counts[j]`` rows of ``x``; full (TP-summed) outputs."""
        xin = copy_to_tp(x, self.tp)
        outs, off = [], 0
        for expert, n in zip(self.experts, counts):
            outs.append(expert.partial(xin[off:off + n]))
            off += n
        y = reduce_from_tp(torch.cat(outs), self.tp)
        if self.experts[0].b_out is not None:
            bias = torch.stack([e.b_out for e in self.experts])
            y = y + torch.repeat_interleave(bias, torch.tensor(counts, device=y.device), dim=0)
        return y

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        n = x.shape[0]
        probs = torch.softmax(F.linear(x, self.router).float(), dim=-1)
        top_p, top_i = probs.topk(self.k, dim=-1)
        gates = top_p / top_p.sum(-1, keepdim=True) if self.k > 1 else top_p
        flat = top_i.reshape(-1)
        order = torch.argsort(flat, stable=True)
        xs = x.index_select(0, order // self.k)
        counts = torch.bincount(flat, minlength=self.E)
        if self.ep.group is None:
            ys = self._experts(xs, counts.tolist())
        else:
            ep, el = self.ep.size, len(self.experts_ids)
            recv = torch.empty_like(counts)
            dist.all_to_all_single(recv, counts, group=self.ep.group)
            send_splits = counts.view(ep, -1).sum(1).tolist()
            recv_m = recv.view(ep, el)
            recv_splits = recv_m.sum(1).tolist()
            xr = all_to_all(xs, recv_splits, send_splits, self.ep)
            # received rows are grouped by source, then by local expert; regroup by expert
            starts = torch.cumsum(recv_m.reshape(-1), 0) - recv_m.reshape(-1)
            rows = recv_m.tolist()
            perm = [torch.arange(int(starts[s * el + j]), int(starts[s * el + j]) + rows[s][j])
                    for j in range(el) for s in range(ep)]
            perm_t = torch.cat(perm).to(x.device) if perm else torch.zeros(0, dtype=torch.long, device=x.device)
            yr_sorted = self._experts(xr.index_select(0, perm_t), recv_m.sum(0).tolist())
            yr = torch.empty_like(yr_sorted).index_copy(0, perm_t, yr_sorted)
            ys = all_to_all(yr, send_splits, recv_splits, self.ep)
        y = torch.empty_like(ys).index_copy(0, order, ys).view(n, self.k, -1)
        out = (y * gates.to(y.dtype).unsqueeze(-1)).sum(1)
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(shape)


class Block(nn.Module):
    """Pre-norm transformer block: attention, then MLP or MoE, each with a residual."""

    def __init__(self, model: ModelSpec, index: int, store: ParamStore, tp: Comm, ep: Comm):
        super().__init__()
        specs = _specs(block_specs(model, index, tp.size, tp.rank, ep.size, ep.rank))
        p = f"layers.{index}."
        self.norm1 = Norm(model, p + "norm1.", specs, store)
        self.attn = Attention(model, p + "attn.", specs, store, tp)
        self.norm2 = Norm(model, p + "norm2.", specs, store)
        self.ffn: nn.Module = (MoE(model, p + "moe.", specs, store, tp, ep) if model.moe_layers[index]
                               else MLP(model, p + "mlp.", specs, store, tp))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class Embedding(nn.Module):
    """Token (and learned position) embedding, replicated over the TP group."""

    def __init__(self, model: ModelSpec, store: ParamStore):
        super().__init__()
        specs = _specs(embedding_specs(model))
        self.tok = store.make(specs["embed.tok"])
        self.pos = store.make(specs["embed.pos"]) if "embed.pos" in specs else None

    def forward(self, ids: Tensor) -> Tensor:
        x = F.embedding(ids, self.tok)
        return x if self.pos is None else x + self.pos[: ids.shape[1]]


class Head(nn.Module):
    """Final norm, vocabulary-parallel output projection and the summed token cross-entropy."""

    def __init__(self, model: ModelSpec, store: ParamStore, tp: Comm):
        super().__init__()
        specs = _specs(head_specs(model, tp.size, tp.rank))
        self.tp = tp
        self.norm = Norm(model, "final_norm.", specs, store)
        self.weight = store.make(specs[head_weight_name(model)])
        self.lo = split_range(model.vocab_size, tp.size, tp.rank)[0]

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        logits = F.linear(copy_to_tp(self.norm(x), self.tp), self.weight)
        logits = logits.reshape(-1, logits.shape[-1])
        if self.tp.group is None:
            return F.cross_entropy(logits.float(), target.reshape(-1), reduction="sum")
        return _VocabParallelCE.apply(logits, target.reshape(-1), self.lo, self.tp.group).sum()


class StageModel(nn.Module):
    """Blocks ``[start, end)``, plus the embedding on a first stage and the head on a last one.

    ``forward`` maps token ids (first stage) or hidden states to hidden states, or to the summed
    token cross-entropy of ``target`` on a last stage. ``recompute`` checkpoints every block.
    """

    def __init__(self, model: ModelSpec, layers: tuple[int, int], first: bool, last: bool, store: ParamStore,
                 tp: Comm = LOCAL, ep: Comm = LOCAL, recompute: bool = False):
        super().__init__()
        self.store, self.recompute = store, recompute
        self.embedding = Embedding(model, store) if first else None
        self.blocks = nn.ModuleList(Block(model, i, store, tp, ep) for i in range(*layers))
        self.head = Head(model, store, tp) if last else None

    def forward(self, x: Tensor, target: Tensor | None = None) -> Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.recompute and self.training else blk(x)
        if self.head is not None:
            assert target is not None
            return self.head(x, target)
        return x


def synthetic_tokens(seed: int, lo: int, hi: int, seq: int, vocab: int) -> Tensor:
    """Token ids [hi - lo, seq + 1] of samples ``lo..hi-1``: each sample depends only on (seed, index)."""
    rows = []
    for j in range(lo, hi):
        g = torch.Generator().manual_seed(name_seed(seed, f"sample.{j}"))
        rows.append(torch.randint(0, vocab, (seq + 1,), generator=g))
    return torch.stack(rows) if rows else torch.zeros(0, seq + 1, dtype=torch.long)
