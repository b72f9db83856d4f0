"""The second search's last pass: mixed rules at the replica count their whole blocks per stage allow.

A stage holds whole blocks, so a mixed pipeline runs at the pace of its slowest stage's whole blocks: 96 blocks
over 61 equal stages run at two a stage, as 48 stages would, and the GPUs of the other 13 stages per replica make
more replicas (fresh hold-out seed200/rob-024, GPT-3-175B over MI300X and MI210 nodes: 5 pipelines of 48 stages
against the rules' 4 of 61). The rules' replica counts come from a grid and their proxy splits blocks as if a
stage held a fraction of one; counting whole blocks in that proxy reorders every mixed rule, which moved the
stored cases both ways (decision 0012). So the finer forms are priced after the second search has run as before
(decision 0048): what the pass finds can only add plans."""

from __future__ import annotations

from arachne.planners.arachne.actions import State
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.rules import may_fit, mix_guess, mixed_rule_state, spare_memory
from arachne.planners.protocol import Deadline

GRANULAR_TOP = 4
"""Finer forms built and screened: those of the rules whose whole-block guess times the replicas gained is
highest (each new form costs new per-stage profiles and a screen of the whole cluster)."""
WHOLE_BLOCK_SHARE = 0.15
"""Of the search's target, at most, for the pass (screening the finer forms; the knobs on a faster one follow)."""


def granular_replicas(ctx: PlanningContext, st: State) -> tuple[int, float] | None:
    """``(R2, guess)``: more replicas for the mixed rule ``st`` where its stages hold more whole blocks than the
    model has at the pace of its slowest one (``R x blocks // L``), with the rule's whole-block guess; None where
    no replica is gained."""
    guess, blocks = mix_guess(ctx, st, True)
    R = st.mix_replicas
    R2 = int(R * blocks / ctx.model.num_layers + 1e-9)
    return (R2, guess) if R2 > R else None


def finer_forms(ctx: PlanningContext) -> list[State]:
    """The mixed rules that the rule pool built (``ctx.mixed_rule_args``) at their :func:`granular_replicas`, for
    the :data:`GRANULAR_TOP` whose guess scaled by the replicas gained is highest, kept where the finer form's own
    whole-block guess is higher and it may fit."""
    spare = spare_memory(ctx.classes)
    seen, ranked = set(), []
    for st, (R, *rest) in ctx.mixed_rule_args:
        if st.template() in seen:
            continue
        seen.add(st.template())
        if (more := granular_replicas(ctx, st)) is not None:
            ranked.append((more[1] * more[0] / R, more[1], (more[0], *rest)))
    out = []
    for _, guess, args in sorted(ranked, key=lambda r: -r[0])[:GRANULAR_TOP]:
        st = mixed_rule_state(ctx, *args)
        if (st is not None and st.template() not in seen and may_fit(ctx, st, spare[len(st.actions)])
                and mix_guess(ctx, st, True)[0] > guess):
            seen.add(st.template())
            out.append(st)
    return out


def whole_block_pass(ctx: PlanningContext, pricer: Pricer, deadline: Deadline) -> list[State]:
    """Screens :func:`finer_forms` while ``deadline`` lasts (the plans join the pricer's); returns those screened."""
    done = []
    for st in finer_forms(ctx):
        if deadline.expired():
            break
        pricer.screen_state(st)
        done.append(st)
    return done
