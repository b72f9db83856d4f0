"""How well templates are ordered for screening: at large scale only the first few get screened.

For every case, the pool -- the policy's top-24 proposals and the planner's rule pool (``rule_pool``:
mixed rules, deeper pipelines, the depth rule) -- is screened once (the cost model's price at the most promising
micro-batch size). An ordering scores, for K = 2, 4, 8, 16, the best screened throughput among its
first K templates divided by the best of the whole pool. Orderings:
  learned      the learned ranker over the whole pool (``arachne train-ranker``; the planner's order)
  interleaved  policy proposals interleaved with the rules (the planner's order before the ranker)
  proxy        the ranker's hand-made pipeline model alone (its first feature) over the whole pool
  rules        the mixed rules alone, in their own order (proxy interleaved with the plain order)
  rule-proxy   the mixed rules alone, by their throughput proxy (``_mix_proxy``)
  plain        the mixed rules, all classes at one tp level, more replicas first (the first rule)
  random       the whole pool shuffled (mean of 5 shuffles)
It also prints how much the policy's proposals add: the best of every rule template (the floor's
core and the rule pool), screened, against the best with the proposals.
Cases: the planners grid (``benchmarks/planners.py``) and the random clusters of
``benchmarks/robustness.py`` for each ``--seeds`` value; neither is in the ranker's training set.

Usage:  python benchmarks/rule_order.py [--seeds 0,1] [--ranker FILE ...] [--out results/rule_order]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import importlib.util
import random
import statistics
import sys
from itertools import zip_longest
from pathlib import Path

from rich.console import Console
from rich.table import Table

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
from arachne.planners.arachne.search.beams import policy_search
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.rules import (
    _mix_proxy,
    mixed_floor_states,
    mixed_rule_state,
    rule_pool,
)
from arachne.planners.arachne.template import tp_options
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog

console = Console(width=140)
KS = (2, 4, 8, 16)
ORDERS = ("learned", "interleaved", "proxy", "rules", "rule-proxy", "plain", "random")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def cases(seeds: list[int]):
    grid = _load("planners")
    for c in grid.CASES:
        yield c.name, grid.make_cluster(c.cluster, list(c.groups)), c.model, c.gbs, c.seq
    rob = _load("robustness")
    for seed in seeds:
        rng = random.Random(seed)
        for i in range(30):
            rc = rob.random_case(rng, i)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--ranker", type=Path, nargs="+", default=None,
                    help="ranker weights, several for an ensemble (default: the shipped ones)")
    ap.add_argument("--out", type=Path, default=Path("results/rule_order"))
    a = ap.parse_args()
    try:
        ranker = RankerEnsemble([Policy.load(f) for f in a.ranker]) if a.ranker else shipped_ranker()
    except (OSError, ValueError, KeyError) as e:
        ap.error(f"--ranker: {' '.join(map(str, a.ranker))}: not ranker.npz files ({e})")
    if ranker is None:
        ap.error("no ranker: train one with `arachne train-ranker` or pass --ranker")
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
                  "rule-proxy": [st.template() for st in sorted(mixed, key=lambda s_: -_mix_proxy(ctx, s_))],
                  "plain": plain_order(ctx)}
        # how much the policy's proposals add: the best of every rule template (the floor's core and the
        # mixed rules) over the best of the pool and the core
        rule_best = max([value.get(st.template(), 0.0) for st in rest] + [pricer.screen_state(st) for st in core])
        row = {"case": name, "gpus": cl.num_gpus, "pool": len(pool), "rules": len(rest),
               "rules@all": rule_best / max(best, rule_best)}
        for o, seq_ in orders.items():
            seq_ = list(dict.fromkeys(seq_))
            for k in KS:
                row[f"{o}@{k}"] = max((value.get(t, 0.0) for t in seq_[:k]), default=0.0) / best
        rng = random.Random(0)
        for k in KS:
            row[f"random@{k}"] = statistics.mean(max(value[t] for t in rng.sample(tpl, min(k, len(tpl)))) / best
                                                 for _ in range(5))
        rows.append(row)
    t = Table(title=f"screening orders over {len(rows)} cases: best of the first K screened / best of the pool "
                    "(mean; in brackets, cases below 0.95)")
    t.add_column("ordering")
    for k in KS:
        t.add_column(f"K={k}", justify="right")
    for o in ORDERS:
        t.add_row(o, *[f"{statistics.mean(r[f'{o}@{k}'] for r in rows):.3f} "
                       f"({sum(r[f'{o}@{k}'] < 0.95 for r in rows)})" for k in KS])
    console.print(t)
    alone = [r["rules@all"] for r in rows]
    console.print(f"every rule template screened (core and mixed), without the policy's proposals: mean "
                  f"{statistics.mean(alone):.3f} of the best with them; a proposal beats every rule template in "
                  f"{sum(x < 1 for x in alone)}/{len(rows)} cases, by more than 2% in {sum(x < 0.98 for x in alone)}")
    _load("arachne_eval").write(a.out, "rule_order", rows)


if __name__ == "__main__":
    main()
