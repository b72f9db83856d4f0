"""The ranker's training problems from the production-like generator, and its screened pools on disk."""

from __future__ import annotations

import numpy as np
import pytest

from arachne.planners.arachne.learned.ranker import TEMPLATE_DIM
from arachne.planners.arachne.train.production import (
    CASES_PER_SEED,
    TRAINING_SEEDS_FROM,
    production_problems,
    random_cases,
)
from arachne.planners.arachne.train.ranker import Pools, RankerConfig, _problems
from arachne.planners.arachne.train.teacher import Record


def test_production_problems_are_the_sweeps_draws_from_the_training_seeds():
    probs = production_problems(CASES_PER_SEED + 3)
    assert len(probs) == CASES_PER_SEED + 3
    first, second = random_cases(TRAINING_SEEDS_FROM), random_cases(TRAINING_SEEDS_FROM + 1)
    assert [p.cluster_doc for p in probs[:CASES_PER_SEED]] == [c.doc for c in first]
    assert [p.cluster_doc for p in probs[CASES_PER_SEED:]] == [c.doc for c in second[:3]]
    assert probs[5].job == {"global_batch_size": first[5].gbs, "sequence_length": first[5].seq}
    cluster, model, job = probs[5].build()
    assert cluster.num_gpus == first[5].num_gpus and model.name == first[5].model


def test_the_training_problems_name_their_source_and_keep_a_tenth_to_validate():
    cfg = RankerConfig(clusters=3, val_clusters=1, production=20, production_seed=1007)
    probs = _problems(cfg)
    names = [n for n, _, _ in probs]
    assert names[:4] == ["policy/0", "policy/1", "policy/2", "policy/3"]
    assert [v for _, _, v in probs[:4]] == [False, False, False, True]
    prod = probs[4:]
    assert len(prod) == 22 and sum(v for _, _, v in prod) == 2 and not any(v for _, _, v in prod[:20])
    assert prod[0][0] == "production/1007/rob-000"


def _records(sizes):
    rng = np.random.default_rng(0)
    return [Record(rng.normal(size=(n, TEMPLATE_DIM)).astype(np.float32), rng.uniform(1, 2, n)) for n in sizes]


def test_pools_round_trip_and_split(tmp_path):
    recs = _records([3, 5, 2])
    pools = Pools(recs, ["policy/0", "policy/1", "production/1000/rob-000"], [False, True, False], {"seed": 4})
    pools.save(tmp_path / "p.npz")
    back = Pools.load(tmp_path / "p.npz")
    assert back.names == pools.names and back.val == pools.val and back.config == {"seed": 4}
    for a, b in zip(recs, back.records):
        assert np.array_equal(a.x, b.x) and np.array_equal(a.values, b.values)
    train, val = back.split()
    assert [len(r.values) for r in train] == [3, 2] and [len(r.values) for r in val] == [5]


def test_files_that_are_not_pools_are_refused_in_plain_words(tmp_path):
    (tmp_path / "a.npz").write_text("name: not numpy")
    np.save(tmp_path / "b.npy", np.zeros(3))
    np.savez(tmp_path / "c.npz", x=np.zeros((1, TEMPLATE_DIM)))
    for name, words in (("a.npz", "not a NumPy .npz archive"), ("b.npy", "single NumPy array"),
                        ("c.npz", "no array named 'values'")):
        with pytest.raises(ValueError, match=words):
            Pools.load(tmp_path / name)


def test_pools_whose_rows_do_not_match_their_names_are_refused(tmp_path):
    x = np.zeros((3, TEMPLATE_DIM), np.float32)
    np.savez(tmp_path / "p.npz", x=x, values=np.ones(3), pool=np.array([0, 1, 5]), names=np.array(["a", "b"]),
             val=np.array([False, True]), config=np.array("{}"))
    with pytest.raises(ValueError, match="do not match"):
        Pools.load(tmp_path / "p.npz")


def test_pools_of_another_feature_width_are_refused(tmp_path):
    np.savez(tmp_path / "p.npz", x=np.zeros((4, TEMPLATE_DIM - 1), np.float32), values=np.ones(4),
             pool=np.zeros(4, int), names=np.array(["a"]), val=np.array([False]), config=np.array("{}"))
    with pytest.raises(ValueError, match="features per template"):
        Pools.load(tmp_path / "p.npz")


@pytest.mark.parametrize("args, field", [(["--pools", "{p}"], "--pools"),
                                          (["--production-seed", "5"], "--production-seed")])
def test_train_ranker_refuses_bad_pools_and_hold_out_seeds(tmp_path, args, field):
    from typer.testing import CliRunner

    from arachne.cli.app import app

    bad = tmp_path / "pools.npz"
    bad.write_text("not a numpy archive")
    res = CliRunner().invoke(app, ["train-ranker", *[a.format(p=bad) for a in args], "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and field in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.torch
def test_a_member_trains_from_the_pools_an_earlier_run_screened(tmp_path):
    pytest.importorskip("torch")
    from arachne.planners.arachne.train.learn import TrainConfig
    from arachne.planners.arachne.train.problems import ProblemConfig
    from arachne.planners.arachne.train.ranker import POOLS_FILE, run_ranker_pipeline

    small = ProblemConfig(min_types=2, max_gpus_per_type=16, max_total_gpus=32)
    cfg = RankerConfig(clusters=3, val_clusters=1, production=2, policy_k=4, seed=2, problems=small,
                       train=TrainConfig(epochs=2, hidden=8, batch_decisions=4))
    _, info = run_ranker_pipeline(cfg, tmp_path / "a", log=lambda s: None)
    assert info["production_problems"] >= 1
    pools = Pools.load(tmp_path / "a" / POOLS_FILE)
    assert sum(n.startswith("production/") for n in pools.names) >= 2
    again = RankerConfig(seed=3, train=TrainConfig(epochs=2, hidden=8, batch_decisions=4, seed=3))
    _, info2 = run_ranker_pipeline(again, tmp_path / "b", log=lambda s: None, pools=pools)
    assert not (tmp_path / "b" / POOLS_FILE).exists() and info2["pools_screened_with_seed"] == 2
    assert info2["templates"] == info["templates"] and info2["config"]["production"] == 2
