"""An elastic restore that moves the model state between processes instead of reloading the checkpoint.

With every checkpoint each rank also keeps a node-local copy of all it holds
(:func:`arachne.runtime.checkpoint.save_local`). When a round's restore is ``migrate``:

1. every member of the round, trainer or idle, opens its own node-local copy of the step to restore
   (the newest complete one, matched by the save's id: :func:`open_local`) and the round all-gathers
   what each holds (:func:`manifest`: names, slices, state keys; no tensors). A node that left is no
   member, so nothing it kept is ever read;
2. rank 0 of the round covers every piece a device of the new plan needs with segments of pieces
   members hold (:func:`plan_moves`), preferring the device's own (what the migration cost model
   assumes stays), then the pieces the shared checkpoint was assembled from, then its node's, then the
   lowest rank. A piece no member holds makes the restore a reload, with the reason;
3. every member sends its segments, one flat buffer per receiver, point to point over the round's
   gloo group (:func:`execute`); a segment a device holds itself is copied in place. Each receiver
   then overwrites its freshly built parameters and Adam moments (:func:`apply_state`).

Replicas (dp copies, a tp group's copies of replicated tensors, a tied head's slice of the embedding)
are bit-identical: their gradients are all-reduced (a tp group's copies computed from the same
all-reduced inputs) and their updates are the same arithmetic. So a moved state is bit-identical to a
reload whichever copy serves it (``tests/runtime/test_elastic.py`` checks every kept copy against the
checkpoint). The state is kept in float32 (the runtime's master precision), so every buffer is float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from arachne.plan import Plan
from arachne.runtime import checkpoint as ckpt
from arachne.runtime.layout import Layout, ParamSpec
from arachne.spec.model import ModelSpec

ADAM_KEYS = ("exp_avg", "exp_avg_sq")
Flat = list[tuple[str, dict[str, Any]]]  # one member's pieces: (canonical name, piece), in file order


class Held(NamedTuple):
    """One piece a member holds: ``name[start:stop]`` along ``dim`` (whole when ``dim`` is None)."""

    name: str
    dim: int | None
    start: int
    stop: int
    writer: bool  # the shared checkpoint's files were assembled from this piece
    keys: tuple[str, ...]


class Move(NamedTuple):
    """Segment ``lo:hi`` along ``dim`` (the whole tensor when None) of canonical tensor ``name``, in every
    state key: from piece ``piece`` of member ``src`` to target ``target`` (index in its spec list) of ``dst``."""

    src: int
    dst: int
    piece: int
    target: int
    dim: int | None
    lo: int
    hi: int


@dataclass
class LocalCopy:
    """A member's node-local copy of the step to restore (empty when it keeps none)."""

    step: int | None = None
    save_id: str | None = None
    flat: Flat = field(default_factory=list)

    @property
    def manifest(self) -> list[Held]:
        return manifest(self.flat)


def flatten(pieces: dict[str, list[dict[str, Any]]] | None) -> Flat:
    return [(name, p) for name, ps in (pieces or {}).items() for p in ps]


def manifest(flat: Flat) -> list[Held]:
    """What a member holds, without the tensors (cheap to all-gather)."""
    return [Held(name, p["dim"], int(p["start"]), int(p["stop"]), bool(p.get("writer")),
                 tuple(k for k in ckpt.STATE_KEYS if k in p)) for name, p in flat]


def open_local(root: Path, device: str) -> LocalCopy:
    """``device``'s own copy of the newest complete step (its older copies are removed first)."""
    latest = ckpt.latest(root)
    if latest is None:
        ckpt.prune_local(root, device, None)
        return LocalCopy()
    meta = ckpt.read_meta(latest)
    step, save_id = int(meta["step"]), meta.get("save_id")
    ckpt.prune_local(root, device, step)
    pieces = ckpt.load_local(root, device, step, save_id) if save_id else None
    return LocalCopy(step, save_id, flatten(pieces))


def state_keys(plan: Plan, step: int) -> tuple[str, ...]:
    """The state a restore of ``step`` sets: the weights, and Adam's moments once a step was taken."""
    return ("param",) + (ADAM_KEYS if plan.optimizer != "sgd" and step > 0 else ())


def targets(plan: Plan, model: ModelSpec) -> dict[str, list[ParamSpec]]:
    """Per device of ``plan``: the pieces it holds, in a fixed order."""
    lay = Layout(plan, model, list(plan.devices))
    return {r.device: lay.param_specs(r) for r in lay.roles}


def _span(h: Held, dim: int, shape: tuple[int, ...]) -> tuple[int, int]:
    return (0, shape[dim]) if h.dim is None else (h.start, h.stop)


def plan_moves(holders: list[tuple[str, list[Held]]], plan: Plan, model: ModelSpec,
               keys: tuple[str, ...]) -> tuple[list[Move] | None, str | None]:
    """Segments covering every piece each device of ``plan`` needs, from what the round's members hold
    (``holders[rank]``: device and manifest); or None and the first piece no member holds."""
    rank_of = {dev: r for r, (dev, _) in enumerate(holders)}
    node = [dev.split(":")[0] for dev, _ in holders]
    by_name: dict[str, list[tuple[int, int, Held]]] = {}
    for r, (_, held) in enumerate(holders):
        for i, h in enumerate(held):
            if set(keys) <= set(h.keys):
                by_name.setdefault(h.name, []).append((r, i, h))
    moves: list[Move] = []
    for dev, specs in targets(plan, model).items():
        dst = rank_of[dev]

        def rank(c: tuple[int, int, Held], dst: int = dst) -> tuple[bool, bool, bool, int, int]:
            return (c[0] != dst, not c[2].writer, node[c[0]] != node[dst], c[0], c[1])

        for ti, spec in enumerate(specs):
            cands = by_name.get(spec.name, [])
            segs = _cover(spec, cands, rank)
            if segs is None:
                where = "" if spec.dim is None else f" [{spec.start}:{spec.stop} along dim {spec.dim}]"
                return None, f"no remaining member holds {spec.name}{where} (needed by {dev})"
            moves += [Move(c[0], dst, c[1], ti, d, lo, hi) for c, d, lo, hi in segs]
    return moves, None


Seg = tuple[tuple[int, int, Held], int | None, int, int]


def _cover(spec: ParamSpec, cands: list[tuple[int, int, Held]], rank: Any) -> list[Seg] | None:
    if spec.dim is not None:
        return _sweep(spec, [c for c in cands if c[2].dim in (None, spec.dim)], spec.dim, spec.start, spec.stop, rank)
    for d in sorted({c[2].dim for c in cands if c[2].dim is not None}):  # a whole tensor from slices
        segs = _sweep(spec, [c for c in cands if c[2].dim in (None, d)], d, 0, spec.shape[d], rank)
        if segs is not None:
            return segs
    whole = [c for c in cands if c[2].dim is None]
    return [(min(whole, key=rank), None, 0, 0)] if whole else None


def _sweep(spec: ParamSpec, cands: list[tuple[int, int, Held]], dim: int, lo: int, hi: int,
           rank: Any) -> list[Seg] | None:
    """``lo:hi`` along ``dim`` cut into segments, each from the best-ranked piece covering its start."""
    out: list[Seg] = []
    pos = lo
    while pos < hi:
        live = [c for c in cands if _span(c[2], dim, spec.shape)[0] <= pos < _span(c[2], dim, spec.shape)[1]]
        if not live:
            return None
        best = min(live, key=rank)
        end = min(hi, _span(best[2], dim, spec.shape)[1])
        out.append((best, dim, pos, end))
        pos = end
    return out


def _cut(piece: dict[str, Any], key: str, m: Move) -> Tensor:
    """The segment of ``m`` out of a held piece."""
    t: Tensor = piece[key]
    if m.dim is None:
        return t
    return t.narrow(m.dim, m.lo - (0 if piece["dim"] is None else int(piece["start"])), m.hi - m.lo)


def _place(buf: Tensor, spec: ParamSpec, m: Move) -> Tensor:
    """Where the segment of ``m`` goes in a target's local tensor."""
    if m.dim is None:
        return buf
    return buf.narrow(m.dim, m.lo - (0 if spec.dim is None else spec.start), m.hi - m.lo)


def _buffers(specs: list[ParamSpec], keys: tuple[str, ...]) -> list[dict[str, Tensor]]:
    return [{k: torch.empty(s.local_shape, dtype=torch.float32) for k in keys} for s in specs]


def _result(specs: list[ParamSpec], bufs: list[dict[str, Tensor]]) -> dict[ParamSpec, dict[str, Tensor]]:
    return {s: b for s, b in zip(specs, bufs)}


def gather(moves: list[Move], flats: list[Flat], specs: dict[int, list[ParamSpec]],
           keys: tuple[str, ...]) -> dict[int, dict[ParamSpec, dict[str, Tensor]]]:
    """What :func:`execute` gives every receiver, computed in one process (for tests and tools)."""
    bufs = {r: _buffers(s, keys) for r, s in specs.items()}
    for m in moves:
        _, piece = flats[m.src][m.piece]
        for k in keys:
            _place(bufs[m.dst][m.target][k], specs[m.dst][m.target], m).copy_(_cut(piece, k, m))
    return {r: _result(specs[r], b) for r, b in bufs.items()}


def execute(moves: list[Move], me: int, flat: Flat, specs: list[ParamSpec], keys: tuple[str, ...],
            group: Any = None) -> tuple[dict[ParamSpec, dict[str, Tensor]], int]:
    """Run the moves over the process group (``me``: this process's rank in it; ``specs``: the pieces it
    receives, empty for a process the new plan leaves idle). Returns its state and the bytes it received
    from other processes. Every rank of the group must call this with the same ``moves``."""
    bufs = _buffers(specs, keys)
    out: dict[int, list[Tensor]] = {}
    into: dict[int, list[Tensor]] = {}
    for m in moves:
        if m.src == me:
            piece = flat[m.piece][1]
            if m.dst == me:
                for k in keys:
                    _place(bufs[m.target][k], specs[m.target], m).copy_(_cut(piece, k, m))
            else:
                out.setdefault(m.dst, []).extend(_cut(piece, k, m).reshape(-1) for k in keys)
        elif m.dst == me:
            into.setdefault(m.src, []).extend(_place(bufs[m.target][k], specs[m.target], m) for k in keys)
    sends = {dst: torch.cat(parts).to(torch.float32) for dst, parts in out.items()}
    recvs = {src: torch.empty(sum(v.numel() for v in views), dtype=torch.float32) for src, views in into.items()}
    ops = [dist.P2POp(dist.isend, buf, _global(dst, group), group=group) for dst, buf in sorted(sends.items())]
    ops += [dist.P2POp(dist.irecv, buf, _global(src, group), group=group) for src, buf in sorted(recvs.items())]
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    for src, views in into.items():
        off = 0
        for v in views:
            v.copy_(recvs[src][off:off + v.numel()].view_as(v))
            off += v.numel()
    return _result(specs, bufs), sum(b.numel() * b.element_size() for b in recvs.values())


def _global(rank: int, group: Any) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def apply_state(w: Any, state: dict[ParamSpec, dict[str, Tensor]], step: int) -> None:
    """Overwrite a built :class:`~arachne.runtime.engine.Worker`'s parameters and Adam moments with moved
    state, as :meth:`Worker.build` sets them from a checkpoint of ``step``."""
    for spec, p in w.entries:
        got = state[spec]
        with torch.no_grad():
            p.copy_(got["param"])
        if w.plan.optimizer != "sgd" and step > 0 and all(k in got for k in ADAM_KEYS):
            w.opt.state[p] = {"step": torch.tensor(float(step)),
                              **{k: got[k].to(p.device, p.dtype).clone() for k in ADAM_KEYS}}
