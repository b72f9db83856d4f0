"""``arachne rule-order``: how well templates are ordered for screening: at large scale only the first few get screened.

For every case, the pool -- the policy's top-24 proposals and the planner's rule pool (``rule_pool``:
mixed rules, deeper pipelines, the depth rule) -- is screened once (the cost model's price at the most promising
micro-batch size). An ordering scores, for K = 2, 4, 8, 16, the best screened throughput among its
first K templates divided by the best of the whole pool. Orderings:
  learned      the learned ranker over the whole pool (``arachne train-ranker``; the planner's order)
  interleaved  policy proposals interleaved with the rules (the planner's order before the ranker)
  proxy        the ranker's hand-made pipeline model alone (its first feature) over the whole pool
  rules        the mixed rules alone, in their own order (proxy interleaved with the plain order)
  rule-proxy   the mixed rules alone, by their throughput proxy (``mix_guess``)
  plain        the mixed rules, all classes at one tp level, more replicas first (the first rule)
  random       the whole pool shuffled (mean of 5 shuffles)
  planner      what the base pass has after screening K: the rule pool's first mixed rule ahead of the learned
               order (``SearchOptions.proxy_first``), and the floor's core, which it prices before screening; scored
               against the best of the pool and the core (the other orderings leave the core out)
Each ordering's K = 8 mean comes with a 95% interval (bootstrap over the cases; how far the mean moves between
sets of clusters is in docs/decisions/0012-tried-and-dropped.md). It also prints how much the policy's proposals add:
the best of every rule template (the floor's core and the rule pool), screened, against the best with the proposals.
Cases: the planners grid and the random clusters of ``sweep run`` for each ``--seeds`` value; neither is
in the ranker's training set.

Usage:  python -m benchmarks arachne rule-order [--seeds 0,1] [--ranker FILE ...] [--out results/arachne]
"""

from __future__ import annotations

import random
import statistics
from itertools import zip_longest

import numpy as np

from arachne.cost import CostModel
from arachne.planners.arachne.actions import mix_replica_options
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy, shipped_policy
from arachne.planners.arachne.learned.ranker import (
    RankerEnsemble,
    ranked_pool,
    shipped_ranker,
    template_matrix,
)
from arachne.planners.arachne.options import ArachneOptions
from arachne.planners.arachne.search.beams import policy_search
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.rules import (
    mix_guess,
    mixed_floor_states,
    mixed_rule_state,
    rule_pool,
)
from arachne.planners.arachne.template import tp_options
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from benchmarks import common

KS = (2, 4, 8, 16)
INTERVAL_K = 8  # the K whose mean gets a bootstrap interval (the default pass screens about 8 on 1,000 GPUs)
ORDERS = ("learned", "interleaved", "proxy", "rules", "rule-proxy", "plain", "random", "planner")


def cases(seeds: list[int]):
    for c in common.GRID_CASES:
        yield c.name, common.grid_cluster(c.cluster, list(c.groups)), c.model, c.gbs, c.seq
    for seed in seeds:
        for rc in common.random_cases(seed):
            yield f"rob{seed}/{rc.name}", cluster_from_dict(rc.doc), rc.model, rc.gbs, rc.seq


def plain_order(ctx: PlanningContext) -> list:
    levels = sorted({t for c in ctx.classes for t in tp_options(ctx.model, c.node_size)})
    out = []
    for R in sorted((r for r in mix_replica_options(ctx.classes) if r), reverse=True):
        for tp in levels:
            st = mixed_rule_state(ctx, R, tp)
            if st is not None and st.template() not in out:
                out.append(st.template())
    return out


def mean_interval(xs: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of the mean of ``xs`` (cases resampled with replacement; seeded, so repeatable)."""
    a = np.asarray(xs, dtype=float)
    if len(a) < 2:
        return (float(a.mean()), float(a.mean())) if len(a) else (float("nan"), float("nan"))
    means = a[np.random.default_rng(seed).integers(0, len(a), (draws, len(a)))].mean(1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def rule_order(a) -> None:
    try:
        ranker = RankerEnsemble([Policy.load(f) for f in a.ranker]) if a.ranker else shipped_ranker()
    except (OSError, ValueError, KeyError) as e:
        common.fail(f"--ranker: {' '.join(map(str, a.ranker))}: not ranker.npz files ({e})")
    if ranker is None:
        common.fail("no ranker: train one with `arachne train-ranker` or pass --ranker")
    rows = []
    for name, cl, model, gbs, seq in cases([int(s) for s in a.seeds.split(",") if s]):
        ctx = PlanningContext(cl, model_catalog().get(model), Job(global_batch_size=gbs, sequence_length=seq),
                              CostModel(cl))
        feats = FeatureBuilder(ctx)
        pricer = Pricer(ctx)
        core, rest, _, _ = rule_pool(ctx, pricer)
        mixed = mixed_floor_states(ctx)
        proposed = policy_search(ctx, shipped_policy(), 24, feats)
        pool, rule = ranked_pool(proposed, rest)
        value = {st.template(): pricer.screen_state(st) for st in pool}
        best = max(value.values(), default=0.0)
        if best <= 0:
            continue
        x = template_matrix(ctx, pool, rule, feats)
        score = ranker.logits(x)
        tpl = [st.template() for st in pool]
        by = lambda key: [tpl[i] for i in sorted(range(len(pool)), key=lambda i: (key(i), i))]  # noqa: E731
        mixed_t = [st.template() for st in mixed]
        orders = {"learned": by(lambda i: -score[i]),
                  "interleaved": [t for pair in zip_longest([st.template() for st in proposed], mixed_t)
                                  for t in pair if t is not None],
                  "proxy": by(lambda i: -x[i, -2]),
                  "rules": mixed_t,
                  "rule-proxy": [st.template() for st in sorted(mixed, key=lambda s_: -mix_guess(ctx, s_, False)[0])],
                  "plain": plain_order(ctx)}
        # how much the policy's proposals add: the best of every rule template (the floor's core and the
        # mixed rules) over the best of the pool and the core
        core_best = max((pricer.screen_state(st) for st in core), default=0.0)
        rule_best = max([value.get(st.template(), 0.0) for st in rest] + [core_best])
        row = {"case": name, "gpus": cl.num_gpus, "pool": len(pool), "rules": len(rest),
               "rules@all": rule_best / max(best, rule_best)}
        first = [st.template() for st in rest[: ArachneOptions().search.proxy_first]]
        planner = list(dict.fromkeys(first + orders["learned"]))
        for k in KS:
            row[f"planner@{k}"] = max([core_best] + [value.get(t, 0.0) for t in planner[:k]]) / max(best, core_best)
        for o, seq_ in orders.items():
            seq_ = list(dict.fromkeys(seq_))
            for k in KS:
                row[f"{o}@{k}"] = max((value.get(t, 0.0) for t in seq_[:k]), default=0.0) / best
        rng = random.Random(0)
        for k in KS:
            row[f"random@{k}"] = statistics.mean(max(value[t] for t in rng.sample(tpl, min(k, len(tpl)))) / best
                                                 for _ in range(5))
        rows.append(row)
    summary = [{"ordering": o, **{f"K={k}": statistics.mean(r[f"{o}@{k}"] for r in rows) for k in KS},
                f"K={INTERVAL_K} 95%": "{:.3f}-{:.3f}".format(*mean_interval([r[f"{o}@{INTERVAL_K}"] for r in rows])),
                **{f"below_0.95@{k}": sum(r[f"{o}@{k}"] < 0.95 for r in rows) for k in KS}} for o in ORDERS]
    common.print_table(f"screening orders over {len(rows)} cases: best of the first K screened / best of the pool "
                       "(mean)", summary, ["ordering", *(f"K={k}" for k in KS), f"K={INTERVAL_K} 95%"])
    alone = [r["rules@all"] for r in rows]
    extra = {"cases": len(rows), "rules_alone_of_best": statistics.mean(alone),
             "proposal_beats_rules": sum(x < 1 for x in alone), "proposal_beats_rules_by_2pct": sum(x < 0.98 for x in alone)}
    common.console.print(f"every rule template screened (core and mixed), without the policy's proposals: mean "
                         f"{extra['rules_alone_of_best']:.3f} of the best with them; a proposal beats every rule "
                         f"template in {extra['proposal_beats_rules']}/{len(rows)} cases, by more than 2% in "
                         f"{extra['proposal_beats_rules_by_2pct']}")
    common.write_result(a.out, "rule_order", rows, {"orderings": summary, "without proposals": extra},
                        {"seeds": a.seeds, "ranker": [str(p) for p in a.ranker or []]}, benchmark="arachne-rule-order")
