"""Beam searches over a template's decisions: the priced teacher (the offline label source) and the
policy's beam search (scored by the learned policy, no pricing)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arachne.planners.arachne.actions import (
    Action,
    State,
    class_actions,
    mix_replica_options,
)
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.rules import may_fit, spare_memory
from arachne.planners.protocol import Deadline


@dataclass
class Decision:
    """One priced step of the teacher: the state, its valid actions and each action's throughput."""

    state: State
    actions: list[Action]
    values: list[float]


def teacher_search(ctx: PlanningContext, pricer: Pricer, beam: int = 4, deadline: Deadline | None = None,
                   progress=None) -> list[Decision]:
    """Beam search over decisions where every partial template is completed and priced."""
    classes, model = ctx.classes, ctx.model
    decisions: list[Decision] = []
    beams = [State(r) for r in mix_replica_options(classes)]
    root_vals = []
    for st in beams:  # decision 0 is priced by the best single-step continuation below
        root_vals.append(0.0)
    for ci in range(len(classes)):
        cand: list[tuple[float, State]] = []
        for st in beams:
            acts = class_actions(st, model, classes[ci])
            vals = []
            for a in acts:
                if deadline is not None and deadline.expired():
                    break
                new = st.push(a)
                v = pricer.price_state(new)
                vals.append(v)
                cand.append((v, new))
                if progress:
                    progress(1)
            decisions.append(Decision(st, acts[: len(vals)], vals))
        cand.sort(key=lambda x: -x[0])
        seen, beams = set(), []
        for v, st in cand:
            key = st.template()
            if key in seen and st.actions[-1].kind == "skip":
                continue
            seen.add(key)
            beams.append(st)
            if len(beams) >= beam:
                break
        if not beams or (deadline is not None and deadline.expired()):
            break
    return decisions


def policy_search(ctx: PlanningContext, policy: Policy, k: int = 24, feats: FeatureBuilder | None = None,
                  deadline: Deadline | None = None) -> list[State]:
    """Beam search on the policy's log-probabilities: the top-k complete decision sequences
    (when the deadline passes, the beams are completed with the policy's single best action)."""
    feats = feats or FeatureBuilder(ctx)
    classes, model = ctx.classes, ctx.model
    roots = mix_replica_options(classes)
    beams: list[tuple[float, State]] = [(0.0, State(r)) for r in roots]
    # a template whose GPUs cannot hold one copy of the model state never fits: such beams are dropped
    # (when some beam can still fit), so a memory-tight problem does not spend its proposals on them
    later = spare_memory(classes)
    for ci in range(len(classes)):
        cand: list[tuple[float, State]] = []
        width = 1 if deadline is not None and deadline.expired() else k
        for lp, st in beams:
            acts = class_actions(st, model, classes[ci], pool=policy.pooled_actions)
            ctx.work.policy_calls += 1
            ctx.work.policy_rows += len(acts)
            logits = policy.logits(feats.batch(st, acts))
            logp = logits - np.logaddexp.reduce(logits)
            order = np.argsort(-logp)[: width]
            cand.extend((lp + float(logp[i]), st.push(acts[i])) for i in order)
        cand.sort(key=lambda x: -x[0])
        viable = [c for c in cand if may_fit(ctx, c[1], later[ci + 1])]
        beams = (viable or cand)[: k]
    return [st for _, st in beams]
