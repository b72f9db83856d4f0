"""Which tensor-parallel groups of a stage price alike.

A TP group's per-micro-batch times depend on the nodes its own devices sit on, the nodes of its MoE all-to-all
ring (and how many rings share its busiest node) and the nodes of its context-parallel ring: on which node
*class* each is (GPU, NIC and link rates, fabric) and which of them share a node, never on the names. So the
cost model prices one group of each kind and takes the slowest: on a stage of thousands of GPUs in identical
nodes that is one or two groups instead of hundreds, with the same result (the groups of a kind would price the
same, and the slowest kind is the one met first in the stage's order either way)."""

from __future__ import annotations

from collections import Counter

from arachne.cost.expert_comm import expert_ring


def group_kinds(ids: tuple[int, ...], classes: tuple, tp: int, cp: int, ep: int, etp: int | None, moe: bool,
                groups: int) -> tuple[tuple[int, tuple[int, ...], int], ...]:
    """One TP group of each kind, in the order the kinds first appear among the ``groups`` TP groups of a stage
    whose devices sit on the stage's nodes ``ids`` (a node index per device, in order) of ``classes`` (per node
    index): ``(group index, its MoE all-to-all ring as positions in the stage's devices, the rings that share
    the ring's busiest node)``; the ring is empty and the count 0 where ``moe`` is false. With ``etp`` the
    experts are re-partitioned ``ep x etp x edp`` (:func:`expert_ring`); without, a ring is the first devices of
    ``ep`` consecutive TP groups, ``tp`` rings to a node."""
    stage_on = Counter(ids) if moe and etp is not None else None
    seen: set[tuple] = set()
    out: list[tuple[int, tuple[int, ...], int]] = []
    for gi in range(groups):
        ring: tuple[int, ...] = ()
        conc = 0
        if moe:
            if stage_on is not None:
                ring = tuple(expert_ring(gi * tp, ep, etp))
                on = Counter(ids[i] for i in ring)
                conc = max(1, max(stage_on[n] // k for n, k in on.items()))
            else:
                ring = tuple((gi - gi % ep + k) * tp for k in range(ep))
                conc = tp
        span = [*range(gi * tp, (gi + 1) * tp), *ring]
        if cp > 1:  # the cp TP groups of its ring, in order
            d = gi // cp
            span += range(d * cp * tp, (d + 1) * cp * tp)
        at = tuple(map(ids.__getitem__, span))
        order = dict.fromkeys(at)  # the span's nodes, numbered by first appearance
        local = dict(zip(order, range(len(order))))
        kind = (tuple(map(local.__getitem__, at)), tuple(map(classes.__getitem__, order)), conc)
        if kind not in seen:
            seen.add(kind)
            out.append((gi, ring, conc))
    return tuple(out)
