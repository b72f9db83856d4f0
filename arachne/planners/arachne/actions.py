"""Templates as a sequence of decisions, one per device class (fastest first).

Decision 0 picks how many replicas ``R`` a *mixed* pipeline group has (0: none). Then each
class picks one action: ``skip``; ``own`` (homogeneous pipelines of ``S`` stages of (tp, dp, ep),
as many replicas as fit); or ``mix`` (``k`` stages of (tp, dp, ep) in each of the ``R`` mixed
replicas; *pooled* when the class alone has too few GPUs for one stage per replica and later classes
of its GPU type make up the rest). A class only has the GPUs that earlier pooled actions left it.
Any prefix of decisions is itself a template (later classes unused), which is what lets both the
teacher and the policy build templates step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from arachne.planners.arachne.template import (
    DeviceClass,
    Group,
    Slot,
    Template,
    ep_options,
    pool_classes,
    slot_fits_nodes,
    tp_options,
)
from arachne.spec.model import ModelSpec

STAGE_COUNTS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
DP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Action:
    kind: str  # "skip" | "own" | "mix"
    tp: int = 1
    dp: int = 1
    ep: int = 1
    stages: int = 0      # S for own, k for mix
    replicas: int = 0    # own: replicas; mix: the group's R
    pool: bool = False   # mix: also draws from later classes of the same GPU type


@dataclass(frozen=True)
class State:
    """Decisions so far: mixed-group replicas and one action per decided class."""

    mix_replicas: int
    actions: tuple[Action, ...] = ()

    def step(self) -> int:
        return len(self.actions)

    def push(self, a: Action) -> "State":
        return replace(self, actions=self.actions + (a,))

    def mixed_stages(self) -> int:
        return sum(a.stages for a in self.actions if a.kind == "mix")

    def template(self) -> Template:
        groups = []
        mix_slots: list[Slot] = []
        for ci, a in enumerate(self.actions):
            if a.kind == "own":
                groups.append(Group(tuple(Slot(ci, a.tp, a.dp, a.ep) for _ in range(a.stages)), a.replicas))
            elif a.kind == "mix":
                mix_slots.extend(Slot(ci, a.tp, a.dp, a.ep, a.pool) for _ in range(a.stages))
        if mix_slots:
            groups.insert(0, Group(tuple(mix_slots), self.mix_replicas))
        return Template(tuple(groups))

    def is_empty(self) -> bool:
        return all(a.kind == "skip" for a in self.actions)


REPLICA_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def mix_replica_options(classes: list[DeviceClass], max_options: int = 10) -> list[int]:
    """Mixed-group replica counts worth trying: 0, then 1, 2, 3, 4, 6, 8, ... up to the second-largest
    class with its later kin (a mix needs two classes; a class too small for ``R`` replicas just stays out
    of the mix). Beyond ``max_options``, the larger non-powers of two go first."""
    if len(classes) < 2:
        return [0]
    cap = mix_replica_cap(classes)
    out = [r for r in REPLICA_COUNTS if r <= cap]
    while len(out) > max_options:
        odd = [r for r in out if r & (r - 1)]
        out.remove(odd[-1] if odd else out[-1])
    return [0, *out]


def mix_replica_cap(classes: list[DeviceClass]) -> int:
    """The most mixed replicas worth trying: the second-largest class with its later kin."""
    return sorted((sum(n for j, n, _ in c.kin if j >= c.index) or c.count for c in classes), reverse=True)[1]


def type_fills(classes: list[DeviceClass]) -> list[int]:
    """Mixed replica counts that a GPU type split across node sizes fills with one stage each."""
    if len(classes) < 2:
        return []
    cap = mix_replica_cap(classes)
    return sorted({n for c in classes if len(c.kin) > 1 and c.index == c.kin[0][0]
                   for n in [sum(k for _, k, _ in c.kin)] if n <= cap})


def slot_options(model: ModelSpec, c: DeviceClass) -> list[tuple[int, int, int]]:
    """(tp, dp, ep) choices for a slot of class ``c``."""
    out = []
    for tp in tp_options(model, c.node_size):
        for dp in DP_CHOICES:
            if not slot_fits_nodes(tp * dp, c.node_size) or tp * dp > c.count:
                continue
            if dp > 1 and tp * dp > c.node_size and not model.is_moe:
                continue  # stage dp across nodes only pays off for experts
            eps = ep_options(model, dp)
            for ep in sorted({eps[0], eps[-1]}):
                out.append((tp, dp, ep))
    return out


def replica_variants(a: Action, c: DeviceClass, global_batch: int | None = None) -> list[Action]:
    """An ``own`` action with fewer replicas: as many as fit in one node (one when a pipeline spans
    nodes), since on a slow inter-node network one node's worth can beat data parallelism across
    nodes; and, given ``global_batch``, the most replicas that share the batch evenly (17 replicas of
    a batch of 384 leave most of them waiting on the ones with an extra sequence)."""
    if a.kind != "own" or a.replicas < 2:
        return []
    counts = []
    if len(c.nodes) > 1:
        counts.append(max(1, c.node_size // (a.stages * a.tp * a.dp)))
    if global_batch:
        counts.append(max(r for r in range(1, a.replicas + 1) if global_batch % r == 0))
    return [replace(a, replicas=r) for r in sorted(set(counts), reverse=True) if r < a.replicas]


def kin_left(state: State, c: DeviceClass) -> dict[int, int]:
    """GPUs left in each class of ``c``'s GPU type after the decisions in ``state`` (pooled mix actions
    take their own class's GPUs first, then later kin's, as :meth:`Template.fits_counts` does)."""
    left = {j: n for j, n, _ in c.kin} or {c.index: c.count}
    for j, _, _ in c.kin:
        if j >= len(state.actions):
            break
        a = state.actions[j]
        if a.kind == "skip":
            continue
        need = a.replicas * a.stages * a.tp * a.dp
        for i in [j] + [i for i, _, size in c.kin if a.pool and i > j and slot_fits_nodes(a.tp * a.dp, size)]:
            take = min(need, left[i])
            left[i] -= take
            need -= take
    return left


def class_actions(state: State, model: ModelSpec, c: DeviceClass, max_stages: int | None = None,
                  pool: bool = True) -> list[Action]:
    """Valid actions for the next class given the decisions so far: with the GPUs it has left, a mix also
    pooled with its later kin where it alone is too small for a stage per replica (unless ``pool`` is
    False: the shipped policy was trained before pooled actions existed)."""
    L = model.num_layers
    acts = [Action("skip")]
    cap_stages = min(L, max_stages or L)
    left = kin_left(state, c) if len(c.kin) > 1 else {c.index: c.count}
    count = left[c.index]
    for tp, dp, ep in slot_options(model, c):
        g = tp * dp
        for S in STAGE_COUNTS:
            if S > cap_stages or S * g > count:
                break
            acts.append(Action("own", tp, dp, ep, S, count // (S * g)))
        R = state.mix_replicas
        if R:
            used = state.mixed_stages()
            # pooled only where the class alone cannot give every replica a stage
            more = 0 if R * g <= count or not pool else sum(left[j] for j in pool_classes(c, g, tp))
            for k in STAGE_COUNTS:
                if used + k > L or R * k * g > count + more:
                    break
                acts.append(Action("mix", tp, dp, ep, k, R, pool=R * k * g > count))
    return acts
