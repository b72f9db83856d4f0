"""Where every part of a plan runs: ranks, roles, parameter shards, process groups, p2p routes.

Torch-free, so that ``arachne export`` and the tests can use it without torch. Every process
builds the same :class:`Layout` from the plan, so all of them agree on group membership and on
the order in which groups are created and used.

Parameters have canonical (unsharded, tp-independent) names and shapes; a device holds a
:class:`ParamSpec`: a slice of one canonical tensor plus how its gradient combines:

- ``partial``: the device's gradient is its own contribution for its slice (TP-sharded weights,
  experts, the vocabulary-parallel head);
- ``replica``: every rank of a TP group holds the whole tensor and computes the same gradient
  (norms, row-parallel biases, the router, the embedding); one rank per TP group contributes.

The exact full-batch gradient of a canonical tensor is the sum of the contributions of every
holder in every pipeline; :meth:`Layout.grad_sync` turns that into all-reduces.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from arachne.plan import Plan
from arachne.spec.model import ModelSpec

Mode = Literal["partial", "replica"]
Init = Literal["normal", "out", "zeros", "ones"]


def split_range(n: int, parts: int, i: int) -> tuple[int, int]:
    """Part ``i`` of ``range(n)`` cut in ``parts`` near-equal contiguous pieces."""
    return i * n // parts, (i + 1) * n // parts


@dataclass(frozen=True)
class ParamSpec:
    """One device's piece of a canonical parameter: ``full[start:stop]`` along ``dim`` (or all)."""

    name: str
    shape: tuple[int, ...]
    dim: int | None = None
    start: int = 0
    stop: int = 0
    mode: Mode = "replica"
    init: Init = "normal"

    @property
    def local_shape(self) -> tuple[int, ...]:
        if self.dim is None:
            return self.shape
        s = list(self.shape)
        s[self.dim] = self.stop - self.start
        return tuple(s)

    @property
    def region(self) -> tuple[int | None, int, int]:
        return (self.dim, self.start, self.stop) if self.dim is not None else (None, 0, 0)


def _full(name: str, shape: tuple[int, ...], init: Init = "normal", mode: Mode = "replica") -> ParamSpec:
    return ParamSpec(name, shape, None, 0, 0, mode, init)


def _sliced(name: str, shape: tuple[int, ...], dim: int, lo: int, hi: int, init: Init = "normal") -> ParamSpec:
    return ParamSpec(name, shape, dim, lo, hi, "partial", init)


def norm_specs(model: ModelSpec, prefix: str) -> list[ParamSpec]:
    h = model.hidden_size
    out = [_full(prefix + "weight", (h,), "ones")]
    if model.bias:
        out.append(_full(prefix + "bias", (h,), "zeros"))
    return out


def mlp_specs(model: ModelSpec, prefix: str, width: int, tp: int, tp_rank: int) -> list[ParamSpec]:
    """Column-parallel input projection(s), row-parallel output projection over the TP group."""
    h = model.hidden_size
    lo, hi = split_range(width, tp, tp_rank)
    ins = ("gate", "up") if model.mlp == "swiglu" else ("fc1",)
    out_name = "down" if model.mlp == "swiglu" else "fc2"
    specs: list[ParamSpec] = []
    for n in ins:
        specs.append(_sliced(f"{prefix}{n}.weight", (width, h), 0, lo, hi))
        if model.bias:
            specs.append(_sliced(f"{prefix}{n}.bias", (width,), 0, lo, hi, "zeros"))
    specs.append(_sliced(f"{prefix}{out_name}.weight", (h, width), 1, lo, hi, "out"))
    if model.bias:
        specs.append(_full(f"{prefix}{out_name}.bias", (h,), "zeros"))
    return specs


def attention_heads(model: ModelSpec, tp: int, tp_rank: int) -> tuple[int, int, int, int]:
    """(q_lo, q_hi, kv_lo, kv_hi): this rank's query heads and the KV heads they read."""
    q_lo, q_hi = split_range(model.num_attention_heads, tp, tp_rank)
    group = model.num_attention_heads // model.kv_heads
    return q_lo, q_hi, q_lo // group, (q_hi - 1) // group + 1


def attention_specs(model: ModelSpec, prefix: str, tp: int, tp_rank: int) -> list[ParamSpec]:
    h, hd = model.hidden_size, model.head_dim
    H, kv = model.num_attention_heads, model.kv_heads
    q_lo, q_hi, kv_lo, kv_hi = attention_heads(model, tp, tp_rank)
    specs = [_sliced(prefix + "q.weight", (H * hd, h), 0, q_lo * hd, q_hi * hd)]
    if model.bias:
        specs.append(_sliced(prefix + "q.bias", (H * hd,), 0, q_lo * hd, q_hi * hd, "zeros"))
    for n in ("k", "v"):
        specs.append(_sliced(f"{prefix}{n}.weight", (kv * hd, h), 0, kv_lo * hd, kv_hi * hd))
        if model.bias:
            specs.append(_sliced(f"{prefix}{n}.bias", (kv * hd,), 0, kv_lo * hd, kv_hi * hd, "zeros"))
    specs.append(_sliced(prefix + "o.weight", (h, H * hd), 1, q_lo * hd, q_hi * hd, "out"))
    if model.bias:
        specs.append(_full(prefix + "o.bias", (h,), "zeros"))
    return specs


def shared_expert_width(model: ModelSpec) -> int:
    return model.shared_expert_ffn_hidden_size or model.expert_ffn * model.num_shared_experts


def local_experts(model: ModelSpec, ep: int, ep_rank: int) -> range:
    return range(*split_range(model.num_experts, ep, ep_rank))


def block_specs(model: ModelSpec, index: int, tp: int = 1, tp_rank: int = 0, ep: int = 1,
                ep_rank: int = 0) -> list[ParamSpec]:
    """Parameters of transformer block ``index`` on one device."""
    p = f"layers.{index}."
    specs = norm_specs(model, p + "norm1.") + attention_specs(model, p + "attn.", tp, tp_rank)
    specs += norm_specs(model, p + "norm2.")
    if model.moe_layers[index]:
        specs.append(_full(p + "moe.router.weight", (model.num_experts, model.hidden_size)))
        for e in local_experts(model, ep, ep_rank):
            specs += mlp_specs(model, f"{p}moe.experts.{e}.", model.expert_ffn, tp, tp_rank)
        if model.num_shared_experts:
            specs += mlp_specs(model, p + "moe.shared.", shared_expert_width(model), tp, tp_rank)
    else:
        specs += mlp_specs(model, p + "mlp.", model.ffn_hidden_size, tp, tp_rank)
    return specs


def embedding_specs(model: ModelSpec) -> list[ParamSpec]:
    specs = [_full("embed.tok", (model.vocab_size, model.hidden_size))]
    if model.position_embedding == "learned":
        specs.append(_full("embed.pos", (model.max_sequence_length, model.hidden_size)))
    return specs


def head_weight_name(model: ModelSpec) -> str:
    return "embed.tok" if model.tied_embeddings else "head.weight"


def head_specs(model: ModelSpec, tp: int = 1, tp_rank: int = 0) -> list[ParamSpec]:
    """Final norm and the vocabulary-parallel output projection (tied: a slice of the embedding)."""
    lo, hi = split_range(model.vocab_size, tp, tp_rank)
    return norm_specs(model, "final_norm.") + [
        _sliced(head_weight_name(model), (model.vocab_size, model.hidden_size), 0, lo, hi)]


def name_order(name: str) -> tuple[int, int, str]:
    """Canonical order of parameter names: embedding, blocks by index, head."""
    if name.startswith("embed."):
        return (0, 0, name)
    if name.startswith("layers."):
        return (1, int(name.split(".")[1]), name)
    return (2, 0, name)


def checkpoint_file(name: str) -> str:
    """The per-layer checkpoint file holding canonical parameter ``name``."""
    if name.startswith("embed."):
        return "embedding.pt"
    if name.startswith("layers."):
        return f"layer-{int(name.split('.')[1]):05d}.pt"
    return "head.pt"


@dataclass(frozen=True)
class Role:
    """What one process does: its device, pipeline, stage, dp group and TP rank."""

    rank: int
    device: str
    pipeline: int
    stage: int
    group: int
    tp_rank: int
    tp: int
    dp: int
    ep: int
    num_stages: int
    layers: tuple[int, int]
    recompute: bool

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_stages - 1

    @property
    def ep_rank(self) -> int:
        return self.group % self.ep

    @property
    def ep_block(self) -> int:
        return self.group // self.ep

    @property
    def tp_key(self) -> tuple[int, int, int]:
        """Identifies this process's TP group."""
        return (self.pipeline, self.stage, self.group)


@dataclass(frozen=True)
class Route:
    """One p2p message of a micro-batch: rows ``[src_lo, src_hi)`` of the sender's tensor land
    in rows ``[dst_lo, dst_hi)`` of the receiver's."""

    peer: int
    src_lo: int
    src_hi: int
    dst_lo: int
    dst_hi: int


@dataclass(frozen=True)
class SyncItem:
    """One canonical parameter in one gradient all-reduce bucket of one rank.

    ``full``: all-reduce a full-shape buffer into which each local piece adds its contribution
    (mixed TP degrees, tied weights, overlapping slices); otherwise the local shard's gradient
    is all-reduced as is among holders of the same slice.
    """

    name: str
    full: bool
    specs: tuple[ParamSpec, ...]
    contributes: tuple[bool, ...]


@dataclass
class Layout:
    """A plan resolved to processes. ``ranks`` orders devices (default: ``plan.devices``)."""

    plan: Plan
    model: ModelSpec
    order: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.order:
            self.order = list(self.plan.devices)
        if sorted(self.order) != sorted(self.plan.devices):
            raise ValueError("rank order does not list the plan's devices")
        self.rank_of = {d: i for i, d in enumerate(self.order)}
        roles: dict[int, Role] = {}
        self.position: dict[tuple[int, int, int, int], int] = {}
        for pi, pipe in enumerate(self.plan.pipelines):
            for si, st in enumerate(pipe.stages):
                for g, devs in enumerate(st.groups()):
                    for r, d in enumerate(devs):
                        rank = self.rank_of[d]
                        roles[rank] = Role(rank, d, pi, si, g, r, st.tp, st.dp_size, st.ep, len(pipe.stages),
                                           st.layers, st.recompute)
                        self.position[(pi, si, g, r)] = rank
        self.roles = [roles[i] for i in range(len(self.order))]

    @property
    def world_size(self) -> int:
        return len(self.order)

    # ---- data -----------------------------------------------------------------------------
    def mbs(self, pipeline: int) -> int:
        return self.plan.mbs(self.plan.pipelines[pipeline])

    @cached_property
    def pipeline_offsets(self) -> list[int]:
        """First sample (within the global batch) of each pipeline."""
        out, acc = [], 0
        for p in self.plan.pipelines:
            out.append(acc)
            acc += p.micro_batches * self.plan.mbs(p)
        return out

    def samples(self, role: Role, micro_batch: int) -> tuple[int, int]:
        """Samples ``[lo, hi)`` of the global batch that ``role`` processes in ``micro_batch``."""
        mbs = self.mbs(role.pipeline)
        share = mbs // role.dp
        lo = self.pipeline_offsets[role.pipeline] + micro_batch * mbs + role.group * share
        return lo, lo + share

    def micro_batches(self, role: Role) -> int:
        return self.plan.pipelines[role.pipeline].micro_batches

    # ---- schedule and p2p -------------------------------------------------------------------
    def schedule(self, role: Role) -> list[tuple[str, int]]:
        """The stage's order of forward ("F") and backward ("B") passes: 1F1B or GPipe."""
        m = self.micro_batches(role)
        warm = m if self.plan.schedule == "gpipe" else min(role.num_stages - role.stage - 1, m)
        out = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            out += [("F", warm + i), ("B", i)]
        out += [("B", i) for i in range(m - warm, m)]
        return out

    def _stage(self, p: int, s: int):  # noqa: ANN202 - a plan Stage
        return self.plan.pipelines[p].stages[s]

    def _overlaps(self, p: int, s_a: int, s_b: int) -> list[tuple[int, int, int, int]]:
        """(group_a, group_b, lo, hi): micro-batch rows shared by dp groups of two stages."""
        mbs = self.mbs(p)
        da, db = self._stage(p, s_a).dp_size, self._stage(p, s_b).dp_size
        ua, ub = mbs // da, mbs // db
        out = []
        for a in range(da):
            for b in range(db):
                lo, hi = max(a * ua, b * ub), min((a + 1) * ua, (b + 1) * ub)
                if lo < hi:
                    out.append((a, b, lo, hi))
        return out

    def _routes(self, role: Role, other: int, sending: bool) -> list[Route]:
        """Messages between ``role``'s stage and the neighbouring stage ``other`` of its pipeline.

        The same rule serves activations (forward) and their gradients (backward): receiver
        TP rank r reads from sender TP rank ``r % tp_sender``. Rows are cut/concatenated along
        the batch dimension.
        """
        p, me = role.pipeline, role.stage
        st_o = self._stage(p, other)
        ua = self.mbs(p) // role.dp
        uo = self.mbs(p) // st_o.dp_size
        pairs = self._overlaps(p, me, other)
        out = []
        for a, b, lo, hi in pairs:
            if a != role.group:
                continue
            # my data flows to `other` (sending) or from `other` (receiving)
            if sending:
                for r_o in range(st_o.tp):
                    if r_o % role.tp == role.tp_rank:
                        out.append(Route(self.position[(p, other, b, r_o)], lo - a * ua, hi - a * ua,
                                         lo - b * uo, hi - b * uo))
            else:
                src_rank = role.tp_rank % st_o.tp
                out.append(Route(self.position[(p, other, b, src_rank)], lo - b * uo, hi - b * uo,
                                 lo - a * ua, hi - a * ua))
        return out

    def send_forward(self, role: Role) -> list[Route]:
        return [] if role.last else self._routes(role, role.stage + 1, True)

    def recv_forward(self, role: Role) -> list[Route]:
        return [] if role.first else self._routes(role, role.stage - 1, False)

    def send_backward(self, role: Role) -> list[Route]:
        return [] if role.first else self._routes(role, role.stage - 1, True)

    def recv_backward(self, role: Role) -> list[Route]:
        return [] if role.last else self._routes(role, role.stage + 1, False)

    # ---- parameters -------------------------------------------------------------------------
    def param_specs(self, role: Role) -> list[ParamSpec]:
        """Every parameter piece ``role`` holds, in canonical order."""
        m = self.model
        specs: list[ParamSpec] = []
        if role.first:
            specs += embedding_specs(m)
        for i in range(*role.layers):
            specs += block_specs(m, i, role.tp, role.tp_rank, role.ep, role.ep_rank)
        if role.last:
            specs += head_specs(m, role.tp, role.tp_rank)
        return specs

    @cached_property
    def holders(self) -> dict[str, list[tuple[Role, ParamSpec]]]:
        out: dict[str, list[tuple[Role, ParamSpec]]] = defaultdict(list)
        for role in self.roles:
            for spec in self.param_specs(role):
                out[spec.name].append((role, spec))
        return dict(sorted(out.items(), key=lambda kv: name_order(kv[0])))

    @cached_property
    def _sync(self) -> tuple[list[tuple[int, ...]], dict[int, dict[tuple[int, ...], list[SyncItem]]]]:
        per_rank: dict[int, dict[tuple[int, ...], list[SyncItem]]] = defaultdict(lambda: defaultdict(list))
        for name, hs in self.holders.items():
            ranks = [r.rank for r, _ in hs]
            classes = self._fast_classes(hs) if len(set(ranks)) == len(ranks) else None
            if classes is not None:
                for members in classes:
                    group = tuple(sorted(r.rank for r, _ in members))
                    for r, s in members:
                        per_rank[r.rank][group].append(SyncItem(name, False, (s,), (True,)))
                continue
            group = tuple(sorted(set(ranks)))
            mine: dict[int, list[tuple[Role, ParamSpec]]] = defaultdict(list)
            for r, s in hs:
                mine[r.rank].append((r, s))
            for rank, items in mine.items():
                per_rank[rank][group].append(SyncItem(
                    name, True, tuple(s for _, s in items),
                    tuple(s.mode == "partial" or r.tp_rank == 0 for r, s in items)))
        groups = sorted({g for d in per_rank.values() for g in d if len(g) > 1})
        return groups, {k: dict(v) for k, v in per_rank.items()}

    @staticmethod
    def _fast_classes(hs: list[tuple[Role, ParamSpec]]) -> list[list[tuple[Role, ParamSpec]]] | None:
        """Holder classes whose shard gradients can be all-reduced as they are, or None."""
        modes = {s.mode for _, s in hs}
        if modes == {"replica"}:
            if len({r.tp for r, _ in hs}) != 1:
                return None
            by_rank: dict[int, list[tuple[Role, ParamSpec]]] = defaultdict(list)
            for r, s in hs:
                by_rank[r.tp_rank].append((r, s))
            return [by_rank[k] for k in sorted(by_rank)]
        if modes != {"partial"}:
            return None
        by_region: dict[tuple[int | None, int, int], list[tuple[Role, ParamSpec]]] = defaultdict(list)
        for r, s in hs:
            by_region[s.region].append((r, s))
        regions = sorted(by_region)
        if len({d for d, _, _ in regions}) != 1:
            return None
        for (_, _, hi), (_, lo, _) in zip(regions, regions[1:]):
            if lo < hi:
                return None
        return [by_region[k] for k in regions]

    def sync_groups(self) -> list[tuple[int, ...]]:
        """Rank sets of all gradient all-reduce groups (size > 1), in creation order."""
        return self._sync[0]

    def grad_sync(self, rank: int) -> list[tuple[tuple[int, ...], list[SyncItem]]]:
        """This rank's gradient buckets: (group ranks, items), in the same order on every member."""
        mine = self._sync[1].get(rank, {})
        return [(g, mine[g]) for g in sorted(mine)]

    # ---- process groups ------------------------------------------------------------------------
    def tp_group(self, role: Role) -> tuple[int, ...]:
        return tuple(self.position[(role.pipeline, role.stage, role.group, r)] for r in range(role.tp))

    def ep_group(self, role: Role) -> tuple[int, ...]:
        """Ranks exchanging tokens with ``role`` in its MoE all-to-all (same TP rank, one EP block)."""
        base = role.ep_block * role.ep
        return tuple(self.position[(role.pipeline, role.stage, base + j, role.tp_rank)] for j in range(role.ep))

    def all_groups(self) -> list[tuple[int, ...]]:
        """Every process group any rank needs (size > 1), deduplicated, in creation order."""
        groups = {self.tp_group(r) for r in self.roles} | {self.ep_group(r) for r in self.roles}
        groups |= set(self.sync_groups())
        return sorted(g for g in groups if len(g) > 1)

    # ---- checkpoints ----------------------------------------------------------------------------
    @cached_property
    def checkpoint_writers(self) -> dict[int, list[ParamSpec]]:
        """Which pieces each rank writes so that every canonical tensor is covered exactly once-ish
        (one TP group's pieces; overlapping pieces are identical)."""
        out: dict[int, list[ParamSpec]] = defaultdict(list)
        for name, hs in self.holders.items():
            key = min(r.tp_key for r, _ in hs)
            group = [(r, s) for r, s in hs if r.tp_key == key]
            reps = [(r, s) for r, s in group if s.mode == "replica" and r.tp_rank == 0]
            chosen = reps[:1] if reps else [(r, s) for r, s in group if s.mode == "partial"]
            for r, s in chosen:
                out[r.rank].append(s)
        return dict(out)
