"""The learned screening order: template features, ranking, the planner's use of it, training."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from arachne.cost import CostModel
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy, shipped_policy
from arachne.planners.arachne.learned.ranker import (
    TEMPLATE_DIM,
    RankerEnsemble,
    rank_states,
    template_matrix,
)
from arachne.planners.arachne.search.pricer import Pricer
from arachne.planners.arachne.search.rules import (
    depth_states,
    mixed_floor_states,
    rule_pool,
)
from arachne.planners.arachne.train.ranker import planner_pool
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog


def ctx_for(model: str = "LLaMA-2-7B", gbs: int = 128) -> PlanningContext:
    cl = cluster_from_dict({"name": "r", "nodes": [
        {"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8},
        {"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8},
        {"name": "t{i}", "count": 4, "gpu": "T4", "gpus_per_node": 4}]})
    return PlanningContext(cl, model_catalog().get(model), Job(global_batch_size=gbs, sequence_length=2048),
                           CostModel(cl))


def linear_ranker(weights: np.ndarray) -> Policy:
    return Policy([(weights.reshape(-1, 1), np.zeros(1))], np.zeros(TEMPLATE_DIM), np.ones(TEMPLATE_DIM), {})


@pytest.mark.parametrize("model", ["LLaMA-2-7B", "Mixtral-8x7B"])
def test_template_features_are_finite_have_the_declared_width_and_flag_rules(model):
    ctx = ctx_for(model)
    pool, from_rule = planner_pool(ctx, shipped_policy(), 8, FeatureBuilder(ctx))
    x = template_matrix(ctx, pool, from_rule)
    assert x.shape == (len(pool), TEMPLATE_DIM) and np.isfinite(x).all()
    assert any(from_rule) and list(x[:, -3]) == [float(r) for r in from_rule]
    assert x[:, -1].max() == 0.0  # the pool-relative proxy: the best template sits at 0


def test_the_hand_made_proxy_feature_tracks_the_cost_model():
    """The ranker's pipeline model must carry signal: over a pool its ordering agrees with the screened
    throughput more often than not (rank correlation clearly above zero)."""
    ctx = ctx_for()
    pool = mixed_floor_states(ctx)
    x = template_matrix(ctx, pool, [True] * len(pool))
    pricer = Pricer(ctx)
    v = np.array([pricer.screen_state(s) for s in pool])
    ok = v > 0
    rank = lambda a: np.argsort(np.argsort(a))  # noqa: E731
    rho = np.corrcoef(rank(x[ok, -2]), rank(v[ok]))[0, 1]
    assert rho > 0.3


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(st_.lists(st_.floats(-3, 3), min_size=TEMPLATE_DIM, max_size=TEMPLATE_DIM))
def test_ranking_is_a_permutation_sorted_by_score(w):
    ctx = ctx_for()
    pool = mixed_floor_states(ctx)
    flags = [True] * len(pool)
    ranker = linear_ranker(np.array(w))
    out = rank_states(ctx, ranker, pool, flags)
    assert sorted(map(id, out)) == sorted(map(id, pool))
    scores = ranker.logits(template_matrix(ctx, out, flags))
    assert np.all(np.diff(scores) <= 1e-9)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(st_.lists(st_.floats(-3, 3), min_size=2 * TEMPLATE_DIM, max_size=2 * TEMPLATE_DIM),
       st_.floats(0.1, 10))
def test_an_ensemble_sums_standardised_member_scores(w, scale):
    """Scaling one member does not change its weight in the average; a member twice over orders as
    that member alone."""
    ctx = ctx_for()
    pool = mixed_floor_states(ctx)
    x = template_matrix(ctx, pool, [True] * len(pool))
    a, b = linear_ranker(np.array(w[:TEMPLATE_DIM])), linear_ranker(np.array(w[TEMPLATE_DIM:]))
    loud = linear_ranker(np.array(w[TEMPLATE_DIM:]) * scale)
    assert np.allclose(RankerEnsemble([a, b]).logits(x), RankerEnsemble([a, loud]).logits(x), atol=1e-6)
    assert rank_states(ctx, RankerEnsemble([a, a]), pool, [True] * len(pool)) == rank_states(
        ctx, a, pool, [True] * len(pool))
    za, zb = [(v - v.mean()) / (v.std() + 1e-9) for v in (a.logits(x), b.logits(x))]
    assert np.allclose(RankerEnsemble([a, b]).logits(x), za + zb)


def test_rankers_train_on_the_pool_the_planner_ranks():
    """The training pool holds every rule template the planner screens, the depth rule's included."""
    ctx = ctx_for()
    pool, from_rule = planner_pool(ctx, shipped_policy(), 8, FeatureBuilder(ctx))
    core, rest, _, _ = rule_pool(ctx, Pricer(ctx))
    ranked = {st.template() for st in pool}
    assert {st.template() for st in rest} <= ranked
    depth = [st for st in depth_states(ctx) if st not in core]
    assert depth and all(st.template() in ranked for st in depth)
    assert any(from_rule) and not all(from_rule)


@pytest.mark.slow
def test_the_planner_screens_in_the_rankers_order():
    """A ranker that prefers the rules' last template makes the planner screen that one first."""
    ctx = ctx_for()
    cm, job = ctx.cost_model, ctx.job
    seen = []
    orig = Pricer.screen_state

    def spy(self, st):
        seen.append(st.template())
        return orig(self, st)

    w = np.zeros(TEMPLATE_DIM)
    w[-3] = 5.0  # from the rules
    Pricer.screen_state = spy
    try:
        plan, _, res = run_planner("arachne", ctx.cluster, ctx.model, job, cm, SearchBudget(time_budget_s=5),
                                   ranker=linear_ranker(w))
    finally:
        Pricer.screen_state = orig
    assert res.stats.notes["ranked"] > 0
    rules = {s.template() for s in mixed_floor_states(ctx)}
    ranked = [t for t in seen[-res.stats.notes["screened"]:]]  # the lead is screened first only with lead_first
    assert ranked and ranked[0] in rules


@pytest.mark.slow
@pytest.mark.torch
def test_ranker_training_runs_end_to_end(tmp_path):
    pytest.importorskip("torch")
    from arachne.planners.arachne.train.learn import TrainConfig
    from arachne.planners.arachne.train.problems import ProblemConfig
    from arachne.planners.arachne.train.ranker import RankerConfig, run_ranker_pipeline

    cfg = RankerConfig(clusters=6, val_clusters=2, policy_k=4, seed=2,
                       problems=ProblemConfig(min_types=2, max_gpus_per_type=16, max_total_gpus=32),
                       train=TrainConfig(epochs=3, hidden=8, batch_decisions=4))
    ranker, info = run_ranker_pipeline(cfg, tmp_path, log=lambda s: None)
    assert (tmp_path / "ranker.npz").exists() and (tmp_path / "ranker_curve.png").exists()
    assert info["training_problems"] > 0 and info["templates"] > info["training_problems"]
    back = Policy.load(tmp_path / "ranker.npz")
    ctx = ctx_for()
    pool = mixed_floor_states(ctx)
    assert len(rank_states(ctx, back, pool, [True] * len(pool))) == len(pool)


def test_policy_info_reports_the_shipped_ranker():
    import json

    from typer.testing import CliRunner

    from arachne.cli.app import app
    from arachne.planners.arachne.learned.ranker import shipped_ranker

    if shipped_ranker() is None:
        pytest.skip("no ranker checkpoint shipped")
    res = CliRunner().invoke(app, ["policy-info", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["ranker"]["templates"] > info["ranker"]["training_problems"] > 0
    assert len(info["ranker_members"]) == len(shipped_ranker().members) >= 1
    res = CliRunner().invoke(app, ["policy-info"])
    assert res.exit_code == 0 and "ranker checkpoint" in res.output
    assert "pooled mixed actions" in res.output and ("not offered" in res.output) != shipped_policy().pooled_actions


def test_the_shipped_ranker_was_trained_on_the_shipped_policy():
    """The ranker learns to order this policy's proposals: a new policy checkpoint needs a new ranker."""
    from arachne.planners.arachne.learned.policy import shipped_sha256
    from arachne.planners.arachne.learned.ranker import shipped_ranker

    rk = shipped_ranker()
    if rk is None or shipped_policy() is None:
        pytest.skip("no checkpoints shipped")
    for m in rk.members:
        assert m.info.get("policy_sha256") == shipped_sha256(), "retrain the rankers: arachne train-ranker --install"


def test_install_ranker_replaces_the_ensemble_or_adds_a_member(tmp_path):
    from arachne.planners.arachne.learned.ranker import RANKER_OUTPUTS, install_ranker

    out, weights = tmp_path / "run", tmp_path / "weights"
    out.mkdir()
    weights.mkdir()
    for f in RANKER_OUTPUTS:
        (out / f).write_text(f)
    (weights / "policy.npz").write_text("policy")
    assert [install_ranker(out, weights, add) for add in (False, True, True)] == [1, 2, 3]
    assert (weights / "ranker_3_report.json").read_text() == "ranker_report.json"
    assert install_ranker(out, weights, add=False) == 1  # a fresh ranker alone: the other members go
    assert sorted(p.name for p in weights.iterdir()) == sorted([*RANKER_OUTPUTS, "policy.npz"])


def test_train_ranker_refuses_install_and_add_together():
    from typer.testing import CliRunner

    from arachne.cli.app import app

    res = CliRunner().invoke(app, ["train-ranker", "--install", "--add", "--clusters", "2"])
    assert res.exit_code == 2 and "--install/--add" in res.output and "Traceback" not in res.output
