"""Expert parallelism's all-to-all groups and the share of their cross-node bytes a node-deduplicating dispatcher
sends (:meth:`arachne.cost.CostModel._stage` prices each group's all-to-alls with them)."""

from __future__ import annotations

import math
from functools import lru_cache

from arachne.plan import Stage
from arachne.spec.model import ModelSpec


@lru_cache(maxsize=4096)
def dedup_fraction(experts: int, k: int, n: int, members: tuple[int, ...]) -> float:
    """Cross-node bytes of a node-deduplicated dispatch over those of a per-expert one, for a member on the
    node with the most members (``members``: the ring's members per node)."""
    own = max(members)
    k = min(k, experts)
    per_expert = k * (n - own) / n  # copies of a token that leave its node, one per remote expert
    if per_expert <= 0:
        return 1.0
    total = math.comb(experts, k)
    nodes = sum(1 - math.comb(experts - round(experts * m / n), k) / total for m in members)
    nodes -= 1 - math.comb(experts - round(experts * own / n), k) / total  # its own node is not crossed to
    return min(1.0, nodes / per_expert)


def dispatch_dedup(dev_node: dict[str, str], model: ModelSpec, ring: list[str]) -> float:
    """The share of an MoE dispatch's cross-node bytes that a node-deduplicating dispatcher sends: a token
    crosses to each other node that hosts at least one of its ``k`` experts once (DeepEP, Megatron-Core's
    ``flex`` dispatcher; forwarded over the node's own links there), instead of once per chosen expert.
    With uniform routing over ``E`` experts spread evenly over the ring's nodes, a node hosting ``E_n`` of
    them is hit with probability ``1 - C(E - E_n, k) / C(E, k)``. ``dev_node``: each device's node name."""
    per_node: dict[str, int] = {}
    for d in ring:
        per_node[dev_node[d]] = per_node.get(dev_node[d], 0) + 1
    if len(per_node) <= 1:
        return 1.0
    return dedup_fraction(model.num_experts, model.experts_top_k, len(ring), tuple(sorted(per_node.values())))


def expert_ring(r: int, ep: int, etp: int) -> list[int]:
    """The positions, in a stage's devices, of the MoE all-to-all group of its ``r``-th device when they are
    re-partitioned as ``ep x etp x edp`` (Megatron-Core's expert rank order: etp fastest, then ep, then edp)."""
    block = r - r % (ep * etp)
    return [block + e * etp + r % etp for e in range(ep)]


def expert_a2a_ring(dev_node: dict[str, str], st: Stage, r: int, etp: int,
                    stage_on: dict[str, int] | None = None) -> tuple[list[str], int]:
    """The MoE all-to-all group of the stage's ``r``-th device (:func:`expert_ring`), and how many
    such groups share its busiest node's network (the stage's devices there over the group's members there).
    ``stage_on``: the stage's devices per node, when the caller has counted them."""
    devices = st.devices
    ring = [devices[i] for i in expert_ring(r, st.ep, etp)]
    on_node: dict[str, int] = {}
    for d in ring:
        on_node[dev_node[d]] = on_node.get(dev_node[d], 0) + 1
    if stage_on is None:
        stage_on = {n: sum(1 for d in devices if dev_node[d] == n) for n in on_node}
    return ring, max(1, max(stage_on[n] // on_node[n] for n in on_node))
