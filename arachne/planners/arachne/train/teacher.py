"""Label problems with the priced teacher: every decision it prices becomes a training record."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from arachne.cost import CostModel
from arachne.planners.arachne.actions import State, class_actions
from arachne.planners.arachne.features import FeatureBuilder
from arachne.planners.arachne.policy import Policy
from arachne.planners.arachne.search import Pricer, floor_states, policy_search, teacher_search
from arachne.planners.base import Deadline
from arachne.planners.completion import PlanningContext
from arachne.planners.arachne.train.problems import Problem


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
          policy_k: int = 8) -> Labelled:
    """Teacher search on one problem; with ``policy``, also label the states the policy visits."""
    t0 = time.perf_counter()
    cluster, model, job = problem.build()
    ctx = PlanningContext(cluster, model, job, CostModel(cluster))
    pricer = Pricer(ctx)
    feats = FeatureBuilder(ctx)
    deadline = Deadline(seconds)
    decisions = teacher_search(ctx, pricer, beam, deadline)
    floor_states(ctx, pricer, deadline)
    records = [Record(feats.batch(d.state, d.actions).astype(np.float32), np.array(d.values, dtype=np.float64))
               for d in decisions if d.actions and max(d.values) > 0]
    if policy is not None and not deadline.expired():
        for st in policy_search(ctx, policy, policy_k, feats):
            for i in range(len(st.actions)):
                if deadline.expired():
                    break
                prefix = State(st.mix_replicas, st.actions[:i])
                acts = class_actions(prefix, model, ctx.classes[i])
                vals = np.array([pricer.price_state(prefix.push(a)) for a in acts])
                if vals.max() > 0:
                    records.append(Record(feats.batch(prefix, acts).astype(np.float32), vals))
    best = pricer.best()
    return Labelled(records, best[2].tokens_per_s if best else 0.0, time.perf_counter() - t0)
