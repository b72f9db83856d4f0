"""`arachne train-ranker`: learn the screening order. Per generated problem, the pool the planner
orders -- the shipped policy's proposals and the rule pool -- is screened in full by the
cost model; the ranker learns to put the best first (the same listwise loss as the policy)."""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from arachne.cost import CostModel
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import (
    Policy,
    shipped_policy,
    shipped_sha256,
)
from arachne.planners.arachne.learned.ranker import (
    RANKER_OUTPUTS,
    ranked_pool,
    template_matrix,
)
from arachne.planners.arachne.search.beams import policy_search
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.rules import rule_pool
from arachne.planners.arachne.train.learn import TrainConfig, train_policy
from arachne.planners.arachne.train.pipeline import map_tasks, write_outputs
from arachne.planners.arachne.train.problems import (
    Problem,
    ProblemConfig,
    random_problem,
)
from arachne.planners.arachne.train.teacher import Record


@dataclass
class RankerConfig:
    clusters: int = 1500
    val_clusters: int = 150
    policy_k: int = 24          # the planner's proposal count
    workers: int = 1
    address: str | None = None  # Ray cluster address; None with workers > 1 starts a local Ray
    seed: int = 11
    problems: ProblemConfig = field(default_factory=ProblemConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(hidden=128, epochs=60, batch_decisions=64,
                                                                   tau=0.05))


def planner_pool(ctx: PlanningContext, policy: Policy | None, k: int, feats: FeatureBuilder):
    """The templates the planner orders before screening (:func:`ranked_pool` of the policy's proposals
    and the rule pool, as the shipped planner builds them), with their from-the-rules flags."""
    proposed = policy_search(ctx, policy, k, feats) if policy is not None else []
    return ranked_pool(proposed, rule_pool(ctx, Pricer(ctx)).rest)


def rank_record(args: tuple[Problem, int]) -> Record | None:
    """Screen the whole pool of one problem: the features and screened throughput of every template."""
    problem, k = args
    cluster, model, job = problem.build()
    ctx = PlanningContext(cluster, model, job, CostModel(cluster))
    feats = FeatureBuilder(ctx)
    pool, from_rule = planner_pool(ctx, shipped_policy(), k, feats)
    if len(pool) < 2:
        return None
    pricer = Pricer(ctx)
    values = np.array([pricer.screen_state(st) for st in pool])
    if values.max() <= 0:
        return None
    return Record(template_matrix(ctx, pool, from_rule, feats).astype(np.float32), values)


def run_ranker_pipeline(cfg: RankerConfig, out_dir: Path, progress: Callable | None = None,
                        log: Callable[[str], None] = print) -> tuple[Policy, dict]:
    """Generate, screen, fit; writes ranker.npz, ranker_report.json and ranker_curve.png into ``out_dir``."""
    t0 = time.perf_counter()
    rng = random.Random(cfg.seed)
    problems = [random_problem(rng, cfg.problems) for _ in range(cfg.clusters + cfg.val_clusters)]
    records = map_tasks(rank_record, [(p, cfg.policy_k) for p in problems], cfg.workers, cfg.address,
                        progress or (lambda n: None))
    train = [r for r in records[: cfg.clusters] if r is not None]
    val = [r for r in records[cfg.clusters:] if r is not None]
    log(f"{len(train)} training pools ({sum(len(r.values) for r in train)} templates), {len(val)} validation pools")
    d = asdict(cfg)
    d["problems"]["node_sizes"] = list(d["problems"]["node_sizes"])
    d["problems"]["exclude_gpus"] = list(d["problems"]["exclude_gpus"])
    info = {"what": "template ranker (screening order)", "config": d, "trained_at": time.strftime("%Y-%m-%d"),
            "training_problems": len(train), "templates": sum(len(r.values) for r in train),
            "policy_sha256": shipped_sha256()}  # the policy whose proposals were ranked
    ranker, curve = train_policy(train, val, cfg.train, info)
    info["rounds"] = [{"round": 1, "decisions": len(train), "curve": curve}]
    info["wall_time_s"] = time.perf_counter() - t0
    return write_outputs(ranker, info, out_dir, RANKER_OUTPUTS)
