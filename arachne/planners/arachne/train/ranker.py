"""`arachne train-ranker`: learn the screening order. Per generated problem, the pool the planner
orders -- the shipped policy's proposals and the rule pool -- is screened in full by the
cost model; the ranker learns to put the best first (the same listwise loss as the policy).

Problems come from two generators: the policy's (:func:`random_problem`, ``--clusters``) and the
production-like clusters the robustness sweeps draw (:mod:`production`, ``--production``, from seeds of
their own). The screened pools are written to ``ranker_pools.npz``, so another member can be trained
from them (``--pools``) without screening again."""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from arachne.cost import CostModel
from arachne.fileio import replacing
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import (
    Policy,
    shipped_policy,
    shipped_sha256,
)
from arachne.planners.arachne.learned.ranker import (
    RANKER_OUTPUTS,
    TEMPLATE_DIM,
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
from arachne.planners.arachne.train.production import (
    CASES_PER_SEED,
    TRAINING_SEEDS_FROM,
    production_problems,
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
    production: int = 0         # production-like training problems (train/production.py), a tenth more to validate
    production_seed: int = TRAINING_SEEDS_FROM  # their first seed (30 problems per seed)
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


POOLS_FILE = "ranker_pools.npz"


@dataclass
class Pools:
    """Screened pools, in the order the problems were drawn; ``names`` says where each came from
    (``policy/<i>`` or ``production/<seed>/<case>``) and ``val`` whether it validates."""

    records: list[Record]
    names: list[str]
    val: list[bool]
    config: dict

    def split(self) -> tuple[list[Record], list[Record]]:
        return ([r for r, v in zip(self.records, self.val) if not v],
                [r for r, v in zip(self.records, self.val) if v])

    def save(self, path: Path) -> None:
        rows = np.repeat(np.arange(len(self.records)), [len(r.values) for r in self.records])
        with replacing(path) as tmp, open(tmp, "wb") as fh:
            np.savez_compressed(fh, x=np.concatenate([r.x for r in self.records]),
                                values=np.concatenate([r.values for r in self.records]), pool=rows,
                                names=np.array(self.names), val=np.array(self.val),
                                config=np.array(json.dumps(self.config)))

    @classmethod
    def load(cls, path: Path) -> "Pools":
        try:
            archive = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError):
            raise ValueError("not a NumPy .npz archive") from None
        if not hasattr(archive, "files"):
            raise ValueError("a single NumPy array, not an .npz archive")
        with archive as z:
            missing = [k for k in ("x", "values", "pool", "names", "val", "config") if k not in z.files]
            if missing:
                raise ValueError(f"no array named {missing[0]!r}")
            x, values, pool = z["x"], z["values"], z["pool"]
            if x.ndim != 2 or x.shape[1] != TEMPLATE_DIM or len(values) != len(x) or len(pool) != len(x):
                raise ValueError(f"{TEMPLATE_DIM} features per template expected, got {x.shape}")
            n = len(z["names"])
            if len(z["val"]) != n or (len(pool) and (pool.min() < 0 or pool.max() >= n or np.any(np.diff(pool) < 0))):
                raise ValueError(f"{n} pools named, but their rows or validation flags do not match")
            starts = np.searchsorted(pool, np.arange(n + 1))
            records = [Record(x[starts[i]:starts[i + 1]], values[starts[i]:starts[i + 1]]) for i in range(n)]
            return cls(records, [str(s) for s in z["names"]], [bool(v) for v in z["val"]],
                       json.loads(str(z["config"])))


def _problems(cfg: RankerConfig) -> list[tuple[str, Problem, bool]]:
    """(name, problem, validates) in drawing order: the policy generator's training then validation problems,
    then the production-like ones (a tenth more, from the seeds after them, to validate)."""
    rng = random.Random(cfg.seed)
    out = [(f"policy/{i}", random_problem(rng, cfg.problems), i >= cfg.clusters)
           for i in range(cfg.clusters + cfg.val_clusters)]
    if cfg.production:
        n_val = max(1, cfg.production // 10)
        probs = production_problems(cfg.production + n_val, cfg.production_seed)
        out += [(f"production/{cfg.production_seed + i // CASES_PER_SEED}/{p.cluster_doc['name']}", p,
                 i >= cfg.production)
                for i, p in enumerate(probs)]
    return out


def screen_pools(cfg: RankerConfig, progress: Callable | None = None) -> Pools:
    """Generate the problems and screen every one's pool (locally or on Ray)."""
    problems = _problems(cfg)
    records = map_tasks(rank_record, [(p, cfg.policy_k) for _, p, _ in problems], cfg.workers, cfg.address,
                        progress or (lambda n: None))
    d = asdict(cfg)
    d["problems"]["node_sizes"] = list(d["problems"]["node_sizes"])
    d["problems"]["exclude_gpus"] = list(d["problems"]["exclude_gpus"])
    d.pop("train")
    keep = [(name, r, v) for (name, _, v), r in zip(problems, records) if r is not None]
    return Pools([r for _, r, _ in keep], [n for n, _, _ in keep], [v for *_, v in keep], d)


def run_ranker_pipeline(cfg: RankerConfig, out_dir: Path, progress: Callable | None = None,
                        log: Callable[[str], None] = print, pools: Pools | None = None) -> tuple[Policy, dict]:
    """Generate, screen (or take ``pools``, screened before), fit; writes ranker.npz, ranker_report.json,
    ranker_curve.png and (when it screened) the pools into ``out_dir``."""
    t0 = time.perf_counter()
    screened = pools is None
    if pools is None:
        pools = screen_pools(cfg, progress)
    train, val = pools.split()
    log(f"{len(train)} training pools ({sum(len(r.values) for r in train)} templates), {len(val)} validation pools")
    info = {"what": "template ranker (screening order)", "config": {**pools.config, "seed": cfg.seed,
                                                                    "train": asdict(cfg.train)},
            "trained_at": time.strftime("%Y-%m-%d"), "training_problems": len(train),
            "production_problems": sum(1 for n, v in zip(pools.names, pools.val) if n.startswith("production/")
                                       and not v),
            "templates": sum(len(r.values) for r in train),
            "policy_sha256": shipped_sha256()}  # the policy whose proposals were ranked
    if not screened:
        info["pools_screened_with_seed"] = pools.config.get("seed")
    ranker, curve = train_policy(train, val, cfg.train, info)
    info["rounds"] = [{"round": 1, "decisions": len(train), "curve": curve}]
    info["wall_time_s"] = time.perf_counter() - t0
    if screened:
        out_dir.mkdir(parents=True, exist_ok=True)
        pools.save(out_dir / POOLS_FILE)
    return write_outputs(ranker, info, out_dir, RANKER_OUTPUTS)
