"""The arachne planner under a runtime preset, constraints and a cost objective: which templates are worth
pricing (:func:`template_ok`, a cheap check before any pricing), a pricer that drops priced plans breaking
the rules (:class:`RulePricer`), and the sub-clusters a cost-optimal plan may use (:func:`cost_views`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from arachne.cost import Estimate
from arachne.plan import Plan
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.template import Template
from arachne.spec.cluster import Cluster
from arachne.spec.runtimes import Legality


def planner_rules(legality: Legality) -> Legality:
    """The rules the search enforces itself: all but the ZeRO stage and Megatron's layer-split form, which
    the harness fixes on the finished plans (``harness.legal_variants``)."""
    return Legality(replace(legality.runtime, megatron_split=False, pipeline_max_zero=None),
                    legality.constraints.model_copy(update={"zero_stages": None}))


def template_ok(tpl: Template, legality: Legality) -> bool:
    """Whether ``tpl`` can give a plan within the limits that show in a template (tp, pipeline depth, ep,
    one pipeline structure, one tp/dp per pipeline); cheap, so illegal templates are never priced."""
    c, r = legality.constraints, legality.runtime
    if (c.uniform_pipelines or r.one_structure) and len(tpl.groups) > 1:
        return False
    for g in tpl.groups:
        if c.max_pp is not None and g.num_stages > c.max_pp:
            return False
        if r.one_tp_dp and (len({s.tp for s in g.slots}) > 1 or len({s.dp for s in g.slots}) > 1):
            return False
        for s in g.slots:
            if (c.max_tp is not None and s.tp > c.max_tp) or (c.max_ep is not None and s.ep > c.max_ep):
                return False
    return True


@dataclass
class RulePricer(Pricer):
    """A :class:`Pricer` that prices only templates passing :func:`template_ok` and counts a priced plan that
    breaks ``rules`` as no plan (so the search goes on until a legal one fits)."""

    rules: Legality | None = None
    _legal_fit: bool = False

    def _legal(self, r: tuple[Plan, Estimate] | None) -> tuple[Plan, Estimate] | None:
        if r is not None and self.rules is not None and self.rules.errors(r[0], self.ctx.cluster):
            self.ctx.found_fit = self._legal_fit  # a fitting but illegal plan does not end the search
            return None
        if r is not None:
            self._legal_fit = True
        return r

    def __call__(self, tpl: Template) -> tuple[Plan, Estimate] | None:
        if self.rules is not None and not template_ok(tpl, self.rules):
            self.cache[tpl] = None
            return None
        if tpl in self.cache:
            return self.cache[tpl]
        r = self._legal(super().__call__(tpl))
        self.cache[tpl] = r
        return r

    def screen_state(self, st) -> float:
        tpl = st.template()
        if self.rules is not None and not template_ok(tpl, self.rules):
            self.states.setdefault(tpl, st)
            self.screened[tpl] = None
            return 0.0
        v = super().screen_state(st)
        if tpl not in self.cache and self.screened.get(tpl) is not None:
            r = self._legal(self.screened[tpl])
            if r is None:
                self.screened[tpl] = None
                return 0.0
        return v


def cost_views(cluster: Cluster, precision: str) -> list[Cluster]:
    """Sub-clusters a cost-optimal (or cost-limited) plan may run on, for a cluster of several GPU types: each
    type alone, one node of each type, and all types but the one with the most USD per peak FLOP/s."""
    types: dict[str, list[str]] = {}
    for n in cluster.nodes:
        types.setdefault(n.gpu.name, []).append(n.name)
    if len(types) < 2:
        names = types[next(iter(types))]
        return [cluster.subset(names[:1], f"{cluster.name} (one node)")] if len(names) > 1 else []
    views = [cluster.subset(names, f"{cluster.name} ({gpu} only)") for gpu, names in types.items()]
    views += [cluster.subset(names[:1], f"{cluster.name} (one {gpu} node)") for gpu, names in types.items()
              if len(names) > 1]

    def usd_per_flop(gpu: str) -> float:
        node = cluster.node_by_name[types[gpu][0]]
        price = node.price_per_gpu_hour
        try:
            return (price or 0.0) / node.gpu.peak_flops(precision)
        except ValueError:  # no rate at this precision: never worth keeping
            return float("inf")

    worst = max(types, key=usd_per_flop)
    if len(types) > 2:
        keep = [n for gpu, names in types.items() if gpu != worst for n in names]
        views.append(cluster.subset(keep, f"{cluster.name} (without {worst})"))
    return views


FRAMEWORK_GRIDS = (("megatron", {}), ("megatron", {"oblivious": True}))
"""The baselines that plan a framework's own grid (docs/baselines.md): Megatron's 3D grid per GPU type, and
over all GPUs as if identical."""


def framework_floor(cluster: Cluster, model, job, cost_model, budget, score) -> list[tuple[float, Plan]]:
    """Under a framework's rules (one pipeline structure for all replicas), the plans of that framework's own
    grid, as a floor the search must beat: (score, plan) for each that fits, ``score`` being the planner's
    ranking (lower is better). The harness checks every rule on them like on any other plan. The grid's budget
    counts CPU seconds, as the arachne planner's does: the floor, too, is the same under any load."""
    from dataclasses import replace

    from arachne.planners.registry import get_planner

    out: list[tuple[float, Plan]] = []
    # on one GPU type the type-oblivious grid is the per-type grid: the same plans, priced the same
    for name, opts in FRAMEWORK_GRIDS if len(cluster.gpu_types) > 1 else FRAMEWORK_GRIDS[:1]:
        try:
            res = get_planner(name, **opts).plan(cluster, model, job, cost_model, replace(budget, cpu=True))
        except (ValueError, RuntimeError):  # a grid with no layout for this problem: no floor from it
            continue
        for p in res.plans[: max(1, budget.top_k)]:
            est = cost_model.estimate(p, validate=False)
            if est.fits:
                out.append((score(est), p.model_copy(update={"planner": f"{name}{'-oblivious' if opts else ''}"})))
    return out
