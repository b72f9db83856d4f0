"""Label problems with the priced teacher: every decision it visits becomes a training record."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from arachne.cost import CostModel
from arachne.planners.arachne.actions import Action, State, class_actions
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy
from arachne.planners.arachne.search.beams import policy_search, teacher_search
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.refine import refine
from arachne.planners.arachne.search.rules import floor_states
from arachne.planners.arachne.train.problems import Problem
from arachne.planners.protocol import Deadline


@dataclass
class Record:
    """One decision: features of each valid action and the throughput its template reached."""

    x: np.ndarray       # (n_actions, FEATURE_DIM) float32
    values: np.ndarray  # (n_actions,) tokens/s, 0 = does not fit


@dataclass
class Labelled:
    records: list[Record]
    best_tokens_per_s: float
    seconds: float


def label(problem: Problem, beam: int = 3, seconds: float = 20.0, policy: Policy | None = None,
          policy_k: int = 8, paths: int = 3) -> Labelled:
    """Teacher search, rule floor and refinement on one problem; with ``policy``, also the states the
    policy visits. Each decision's action values are in hindsight: the best throughput of any priced
    template that starts with that decision (a prefix's own price undervalues decisions that only
    pay off once later classes join, e.g. the replica count of mixed pipelines). The decision paths
    of the ``paths`` best templates are labelled too, so the policy learns to reach them."""
    t0 = time.perf_counter()
    cluster, model, job = problem.build()
    ctx = PlanningContext(cluster, model, job, CostModel(cluster))
    pricer = Pricer(ctx)
    feats = FeatureBuilder(ctx)
    deadline = Deadline(seconds)
    n = len(ctx.classes)
    decisions: list[tuple[State, list]] = [(d.state, d.actions) for d in teacher_search(ctx, pricer, beam, deadline)]
    floor_states(ctx, pricer, deadline)
    best = pricer.best()
    if best is not None and not deadline.expired():
        refine(ctx, pricer, pricer.states[best[0]], Deadline(min(deadline.remaining, seconds * 0.2)))
    if policy is not None and not deadline.expired():
        for st in policy_search(ctx, policy, policy_k, feats):
            for i in range(len(st.actions)):
                if deadline.expired():
                    break
                prefix = State(st.mix_replicas, st.actions[:i])
                acts = class_actions(prefix, model, ctx.classes[i])
                for a in acts:
                    pricer.price_state(prefix.push(a))
                decisions.append((prefix, acts))
    hindsight = _hindsight(pricer.visited, n)
    top = sorted(((v, st) for st, v in pricer.visited.items() if v > 0), key=lambda x: -x[0])[:paths]
    seen = {(st, tuple(acts)) for st, acts in decisions}
    for _, st in top:
        full = _pad(st, n)
        for i in range(n):
            prefix = State(full.mix_replicas, full.actions[:i])
            acts = class_actions(prefix, model, ctx.classes[i])
            if (prefix, tuple(acts)) not in seen:
                seen.add((prefix, tuple(acts)))
                decisions.append((prefix, acts))
    records = []
    for prefix, acts in decisions:
        vals = np.array([hindsight.get((prefix.mix_replicas, prefix.actions + (a,)), 0.0) for a in acts])
        if len(acts) > 1 and vals.max() > 0:
            records.append(Record(feats.batch(prefix, acts).astype(np.float32), vals))
    best = pricer.best()
    return Labelled(records, best[2].tokens_per_s if best else 0.0, time.perf_counter() - t0)


def _pad(st: State, n: int) -> State:
    """A prefix as the full decision sequence it stands for (later classes skipped)."""
    return State(st.mix_replicas, st.actions + tuple(Action("skip") for _ in range(n - len(st.actions))))


def _hindsight(visited: dict[State, float], n: int) -> dict[tuple, float]:
    """For every decision prefix, the best throughput among priced templates that extend it."""
    out: dict[tuple, float] = {}
    for st, v in visited.items():
        if v <= 0:
            continue
        full = _pad(st, n)
        for i in range(1, n + 1):
            key = (full.mix_replicas, full.actions[:i])
            if v > out.get(key, 0.0):
                out[key] = v
    return out
