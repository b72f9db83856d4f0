"""Placement: each template slot onto concrete devices (tensor-parallel groups inside a node, a replica's
stages next to each other), and the stage orders worth trying."""

from __future__ import annotations

from operator import le, ne

from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import (
    DeviceClass,
    Group,
    Slot,
    Template,
    pool_classes,
)


def place(template: Template, ctx: PlanningContext, order: str = "pipeline") -> list[list[list[tuple[str, ...]]]] | None:
    """Devices for every (group, replica, slot): TP groups inside a node, packed in order.

    ``order="pipeline"`` packs each replica's stages next to each other (cheap point-to-point);
    ``"stage"`` packs the same stage of all replicas together (cheap gradient all-reduce, as
    Megatron's tp-dp-pp rank order does)."""
    free: dict[int, list[list[str]]] = {}
    for c in ctx.classes:
        free[c.index] = _node_devices(c)
    cursor = {c.index: 0 for c in ctx.classes}

    def take_pooled(cls: int, need: int, tp: int) -> tuple[str, ...] | None:
        for j in pool_classes(ctx.classes[cls], need, tp):
            devs = take_from(j, need)
            if devs is not None:
                return devs
        return None

    def take_span(span: tuple[int, ...], need: int, tp: int) -> tuple[str, ...] | None:
        """A spanning slot's GPUs (``Slot.span``): whole tp groups from each node of its classes in turn,
        nothing taken unless all ``need`` are there."""
        plan: list[tuple[list[str], int]] = []
        left = need
        for j in span:
            for node in free[j]:
                k = min(left, len(node) // tp * tp)
                if k:
                    plan.append((node, k))
                    left -= k
                if not left:
                    break
            if not left:
                break
        if left:
            return None
        devs = tuple(d for node, k in plan for d in node[:k])
        for node, k in plan:
            del node[:k]
        return devs

    sizes = [c.node_size for c in ctx.classes]

    def take_from(cls: int, need: int) -> tuple[str, ...] | None:
        size = sizes[cls]
        nodes = free[cls]
        i = cursor[cls]
        if need >= size:
            if need % size:  # a slot spans whole nodes or none (see template.slot_fits_nodes)
                return None
            k = need // size
            while i < len(nodes) and len(nodes[i]) != size:
                i += 1
            j = i
            while j < len(nodes) and j - i < k and len(nodes[j]) == size:
                j += 1
            if j - i < k:
                return None
            devs = tuple([d for n in nodes[i:j] for d in n])
            for n in nodes[i:j]:
                n.clear()
            cursor[cls] = j
            return devs
        n_nodes = len(nodes)
        while i < n_nodes and len(nodes[i]) < need:
            i += 1
        if i >= n_nodes:
            return None
        node = nodes[i]
        devs = tuple(node[:need])
        del node[:need]
        cursor[cls] = i
        return devs

    out: list[list[list[tuple[str, ...]]]] = []
    for g in template.groups:
        S = g.num_stages
        reps: list[list[tuple[str, ...]]] = [[()] * S for _ in range(g.replicas)]
        cells = ([(r, j) for r in range(g.replicas) for j in range(S)] if order == "pipeline"
                 else [(r, j) for j in range(S) for r in range(g.replicas)])
        needs = [(s.cls, s.gpus, s.pool, s.span, s.tp) for s in g.slots]
        for r, j in cells:
            cls, need, pool, span, tp = needs[j]
            devs = take_span(span, need, tp) if span else take_from(cls, need)
            if devs is None and pool:
                devs = take_pooled(cls, need, tp)
            if devs is None:
                return None
            reps[r][j] = devs
        keys = [(ctx.classes[s.cls].gpu.name, s.tp, s.dp, s.ep) for s in g.slots]
        runs = _runs(keys)
        out.append([node_contiguous(keys, devs, runs) for devs in reps])
    return out


def node_contiguous(keys: list[tuple], devs: list[tuple[str, ...]],
                    runs: list[tuple[int, int]] | None = None) -> list[tuple[str, ...]]:
    """Reorder a pipeline's stage devices within each run of interchangeable stages (same GPU type and
    shape) so that stages on one node are adjacent and the run starts on the node the stage before
    it ends on: parts of one node (:func:`node_parts`) are separate classes, and placing them class
    by class would cross between nodes at every part. ``runs``: :func:`_runs` of ``keys``, given instead
    of them (the same for every replica of a group)."""
    out = list(devs)
    if len(devs) < 2:
        return out
    node = [d[0].rsplit(":", 1)[0] for d in devs]

    def hops(seq: list[str]) -> int:
        return sum(map(ne, seq, seq[1:]))

    for i, j in _runs(keys) if runs is None else runs:
        if j - i < 2:
            continue
        run = node[i:j]
        order = list(dict.fromkeys(run))
        if len(order) > 1:
            if i and node[i - 1] in order:
                order.remove(node[i - 1])
                order.insert(0, node[i - 1])
            rank = {n: k for k, n in enumerate(order)}
            ranks = [rank[n] for n in run]
            if all(map(le, ranks, ranks[1:])):  # in order already: the (stable) sort keeps it
                continue
            perm = sorted(range(j - i), key=ranks.__getitem__)
            edge = node[max(0, i - 1):i], node[j:j + 1]
            if hops([*edge[0], *(run[k] for k in perm), *edge[1]]) < hops([*edge[0], *run, *edge[1]]):
                out[i:j] = [devs[i + k] for k in perm]
                node[i:j] = [run[k] for k in perm]
    return out


def _runs(keys: list[tuple]) -> list[tuple[int, int]]:
    """``[i, j)`` of each run of equal keys."""
    out, i = [], 0
    while i < len(keys):
        j = i + 1
        while j < len(keys) and keys[j] == keys[i]:
            j += 1
        out.append((i, j))
        i = j
    return out


_NODE_DEVICES: dict[int, tuple[DeviceClass, tuple[tuple[str, ...], ...]]] = {}
"""A device class (by identity; the entry holds it alive) -> its device ids node by node, built once: placement
starts from them for every template it places."""


def _node_devices(c: DeviceClass) -> list[list[str]]:
    """``c.node_devices()``, as fresh lists (placement consumes them)."""
    hit = _NODE_DEVICES.get(id(c))
    if hit is None:
        if len(_NODE_DEVICES) >= 256:
            _NODE_DEVICES.clear()
        hit = _NODE_DEVICES[id(c)] = (c, tuple(tuple(n) for n in c.node_devices()))
    return [list(n) for n in hit[1]]


def placements(template: Template, ctx: PlanningContext) -> list[list[list[list[tuple[str, ...]]]]]:
    """The placements worth pricing: pipeline order, and stage order where replicas of a stage
    smaller than a node could share nodes."""
    out = [p for p in (place(template, ctx),) if p is not None]
    if any(g.replicas > 1 and any(s.gpus < ctx.classes[s.cls].node_size for s in g.slots) for g in template.groups):
        alt = place(template, ctx, "stage")
        if alt is not None and alt not in out:
            out.append(alt)
    return out


def cap_replicas(template: Template, max_pipelines: int) -> Template:
    """At most ``max_pipelines`` pipelines in total (each needs a micro-batch): later groups give way."""
    if sum(g.replicas for g in template.groups) <= max_pipelines:
        return template
    groups, left = [], max_pipelines
    for g in template.groups:
        r = min(g.replicas, left)
        if r > 0:
            groups.append(Group(g.slots, r))
        left -= r
    return Template(tuple(groups))


def stage_orders(template: Template, classes: list[DeviceClass] | None = None) -> list[Template]:
    """The template, and with its mixed pipelines' classes in reverse order: fastest first puts the
    output layer (large vocabularies need memory for the logits) on the slowest, often smallest, GPUs.
    Where a pipeline runs over the parts of the same nodes (:func:`node_parts`), also node by node."""
    out = [template]
    if any(len({s.cls for s in g.slots}) > 1 for g in template.groups):
        out.append(Template(tuple(Group(_reverse_classes(g.slots), g.replicas) for g in template.groups)))
        if classes is not None:
            groups = tuple(Group(_node_major(g.slots, classes) if g.replicas == 1 else g.slots, g.replicas)
                           for g in template.groups)
            if any(a.slots != b.slots for a, b in zip(groups, template.groups)):
                out.append(Template(groups))
    return out


LEAD_RATIO = 2.0  # a stage of another class leads where its GPUs update the embedding this many times faster


def led_by_widest(template: Template, classes: list[DeviceClass]) -> Template | None:
    """The template with each mixed pipeline led by the stage of another class whose GPUs update
    parameters fastest (tp x dp x memory bandwidth), where that is ``LEAD_RATIO`` times the first stage's:
    the first stage holds the embedding, whose optimizer step on a narrow stage of slow memory sets the
    step's tail (Sailor's plan for Llama-3.1-8B on 15 L4 and 16 P100: a P100 stage of tp 4 ahead of 15
    one-L4 stages). None where no pipeline changes."""
    def speed(sl: Slot) -> float:
        return sl.gpus * classes[sl.cls].gpu.hbm_bandwidth

    groups, changed = [], False
    for g in template.groups:
        first = g.slots[0]
        others = [i for i, sl in enumerate(g.slots) if sl.cls != first.cls and not sl.span]
        if not others or first.span:
            groups.append(g)
            continue
        i = max(others, key=lambda k: (speed(g.slots[k]), -k))
        if speed(g.slots[i]) < LEAD_RATIO * speed(first):
            groups.append(g)
            continue
        groups.append(Group((g.slots[i],) + g.slots[:i] + g.slots[i + 1:], g.replicas))
        changed = True
    return Template(tuple(groups)) if changed else None


def _node_major(slots: tuple[Slot, ...], classes: list[DeviceClass]) -> tuple[Slot, ...]:
    """Runs of slots over sibling parts of the same nodes, reordered to visit one node's parts, then the
    next node's in reverse (``A A B C | C B A A``): one crossing between nodes instead of one per part."""
    out: list[Slot] = []
    i = 0
    while i < len(slots):
        nodes = classes[slots[i].cls].nodes
        j = i + 1
        while j < len(slots) and classes[slots[j].cls].nodes == nodes and not slots[j].pool:
            j += 1
        run = slots[i:j]
        per_class: dict[int, list[Slot]] = {}
        for sl in run:
            per_class.setdefault(sl.cls, []).append(sl)
        N = len(nodes)
        if len(per_class) > 1 and N > 1 and not run[0].pool and all(len(v) % N == 0 for v in per_class.values()):
            for k in range(N):
                part = [sl for v in per_class.values() for sl in v[k * len(v) // N:(k + 1) * len(v) // N]]
                out += part[::-1] if k % 2 else part
        else:
            out += run
        i = j
    return tuple(out)


def _reverse_classes(slots: tuple[Slot, ...]) -> tuple[Slot, ...]:
    runs: list[list[Slot]] = []
    for s in slots:
        if runs and runs[-1][0].cls == s.cls:
            runs[-1].append(s)
        else:
            runs.append([s])
    return tuple(s for run in reversed(runs) for s in run)
