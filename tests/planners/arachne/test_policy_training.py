"""The policy file, its features and the offline training pipeline (teacher labels, Ray)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from planner_cases import ctx_for, split_type_cluster

from arachne.planners.arachne.actions import Action, State, class_actions
from arachne.planners.arachne.learned.features import FEATURE_DIM, FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy


def test_every_action_sequence_is_a_valid_template():
    ctx = ctx_for()
    rng = random.Random(0)
    for _ in range(30):
        st = State(rng.choice([0, 1, 2, 4]))
        for c in ctx.classes:
            st = st.push(rng.choice(class_actions(st, ctx.model, c)))
        tpl = st.template()
        if tpl.groups:
            assert tpl.fits_counts(ctx.classes)


def test_features_have_the_declared_width_and_no_names():
    ctx = ctx_for()
    fb = FeatureBuilder(ctx)
    st = State(0)
    x = fb.batch(st, class_actions(st, ctx.model, ctx.classes[0]))
    assert x.shape[1] == FEATURE_DIM and np.isfinite(x).all()


def test_policy_round_trips_through_npz(tmp_path):
    rng = np.random.default_rng(0)
    pol = Policy([(rng.normal(size=(FEATURE_DIM, 8)), rng.normal(size=8)),
                  (rng.normal(size=(8, 1)), rng.normal(size=1))],
                 np.zeros(FEATURE_DIM), np.ones(FEATURE_DIM), {"seed": 0})
    pol.save(tmp_path / "p.npz")
    back = Policy.load(tmp_path / "p.npz")
    x = rng.normal(size=(5, FEATURE_DIM))
    assert np.allclose(pol.logits(x), back.logits(x)) and back.info == {"seed": 0}


@pytest.mark.slow
@pytest.mark.torch
def test_training_pipeline_runs_end_to_end(tmp_path):
    pytest.importorskip("torch")
    from arachne.planners.arachne.train.learn import TrainConfig
    from arachne.planners.arachne.train.pipeline import PipelineConfig, run_pipeline
    from arachne.planners.arachne.train.problems import ProblemConfig

    cfg = PipelineConfig(clusters=3, val_clusters=1, rounds=2, teacher_seconds=2, seed=1,
                         problems=ProblemConfig(max_gpus_per_type=8, max_total_gpus=16),
                         train=TrainConfig(epochs=3, hidden=16))
    policy, info = run_pipeline(cfg, tmp_path, log=lambda s: None)
    assert (tmp_path / "policy.npz").exists() and (tmp_path / "curve.png").exists()
    assert len(info["rounds"]) == 2 and info["decisions"] > 0
    ctx = ctx_for()
    from arachne.planners.arachne.search.beams import policy_search

    states = policy_search(ctx, Policy.load(tmp_path / "policy.npz"), k=4)
    assert states and all(len(s.actions) == len(ctx.classes) for s in states)


@pytest.mark.slow
@pytest.mark.ray
def test_training_labels_with_ray_when_installed(tmp_path):
    pytest.importorskip("torch")
    ray = pytest.importorskip("ray")
    from arachne.planners.arachne.train.pipeline import PipelineConfig, label_all
    from arachne.planners.arachne.train.problems import ProblemConfig, random_problem

    rng = random.Random(3)
    cfg = PipelineConfig(workers=2, teacher_seconds=1)
    probs = [random_problem(rng, ProblemConfig(max_gpus_per_type=8, max_total_gpus=16)) for _ in range(2)]
    try:
        out = label_all(probs, cfg, None, lambda n: None)
    finally:
        ray.shutdown()
    assert len(out) == 2 and all(lab.best_tokens_per_s > 0 for lab in out)


def test_teacher_labels_value_decisions_by_their_best_completion():
    from arachne.planners.arachne.train.teacher import _hindsight

    a, b = Action("mix", 1, 1, 1, 2, 2), Action("mix", 1, 1, 1, 3, 2)
    visited = {State(2, (a,)): 0.0, State(2, (a, b)): 5.0, State(2, (Action("skip"),)): 1.0}
    h = _hindsight(visited, 2)
    assert h[(2, (a,))] == 5.0  # the prefix alone does not fit, its completion does
    assert h[(2, (Action("skip"),))] == 1.0 and h[(2, (Action("skip"), Action("skip")))] == 1.0


def test_retraining_from_a_foreign_file_is_a_one_line_input_error(tmp_path):
    from arachne.errors import InputError
    from arachne.planners.arachne.train.pipeline import load_records

    bad = tmp_path / "data.npz"
    bad.write_text("name: not numpy\n")
    with pytest.raises(InputError, match="data.npz.*data: not a data.npz"):
        load_records(bad)


def test_an_unreachable_ray_address_is_a_one_line_input_error():
    from arachne.errors import InputError
    from arachne.planners.arachne.train.pipeline import check_reachable

    with pytest.raises(InputError, match="--address"):
        check_reachable("127.0.0.1:1", timeout_s=1)
    with pytest.raises(InputError, match="--address"):
        check_reachable("ray://nohost", timeout_s=1)


def test_the_policy_offers_pooled_actions_only_if_its_teacher_did():
    from arachne.planners.arachne.search.beams import policy_search

    ctx = ctx_for("OPT-350M", gbs=1024, seq=1024, cluster=split_type_cluster())
    w = np.zeros((FEATURE_DIM, 1))
    w[FEATURE_DIM - 12 + 2] = 1.0  # prefer "mix" whenever it is offered
    proposals = {}
    for pooled in (False, True):
        pol = Policy([(w, np.zeros(1))], np.zeros(FEATURE_DIM), np.ones(FEATURE_DIM), {"pooled_actions": pooled})
        proposals[pooled] = policy_search(ctx, pol, 64)
    assert not any(a.pool for st in proposals[False] for a in st.actions)
    assert any(a.pool for st in proposals[True] for a in st.actions)
    assert Policy([(w, np.zeros(1))], np.zeros(FEATURE_DIM), np.ones(FEATURE_DIM), {}).pooled_actions is False
