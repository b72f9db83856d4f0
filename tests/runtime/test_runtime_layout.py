"""The torch-free part of the runtime: p2p routes, gradient-sync groups, schedules, exports."""

from __future__ import annotations

from collections import Counter

import pytest

from arachne.runtime.export import megatron_export, torchrun_export
from arachne.runtime.layout import Layout

pytestmark = pytest.mark.torch


def _mixed(rt):  # two pipelines of different depth, uneven split, tp 2 then 1, stage dp 2
    return rt.make_plan(rt.DENSE, [
        {"micro_batches": 3, "stages": [rt.stage(0, 1, [0, 1], tp=2), rt.stage(1, 4, [2, 3], dp=2)]},
        {"micro_batches": 1, "stages": [rt.stage(0, 3, [4]), rt.stage(3, 4, [5])]}])


def test_routes_cover_every_row_once_and_pair_up(rt, load):
    """Stage dp 2 (tp 2) -> dp 3 (tp 1) -> dp 1 (tp 2): every received row has exactly one sender,
    and every send has the matching receive (same rows) on the other side."""
    doc = rt.make_plan(rt.DENSE, [{"micro_batches": 1, "stages": [
        rt.stage(0, 1, [0, 1, 2, 3], tp=2, dp=2), rt.stage(1, 2, [4, 5, 6], dp=3), rt.stage(2, 4, [7], tp=1)]}],
        gbs=6, mbs=6)
    plan, model = load(doc)
    lay = Layout(plan, model)
    for direction in ("forward", "backward"):
        sends, recvs = set(), set()
        for role in lay.roles:
            send = lay.send_forward(role) if direction == "forward" else lay.send_backward(role)
            recv = lay.recv_forward(role) if direction == "forward" else lay.recv_backward(role)
            sends |= {(role.rank, r.peer, r.src_lo, r.src_hi, r.dst_lo, r.dst_hi) for r in send}
            recvs |= {(r.peer, role.rank, r.src_lo, r.src_hi, r.dst_lo, r.dst_hi) for r in recv}
            rows = Counter(i for r in recv for i in range(r.dst_lo, r.dst_hi))
            if recv:
                assert sorted(rows) == list(range(6 // role.dp)) and set(rows.values()) == {1}
        assert sends == recvs


def test_sync_groups_same_tp_use_shards_mixed_tp_use_full_buffers(rt, load):
    plan, model = load(_mixed(rt))
    lay = Layout(plan, model)
    items = {(g, it.name, it.full) for r in range(lay.world_size) for g, its in lay.grad_sync(r) for it in its}
    # layer 0: held with tp 2 (pipeline 0) and tp 1 (pipeline 1) -> full-shape all-reduce over all holders
    assert {(g, f) for g, n, f in items if n == "layers.0.attn.q.weight"} == {((0, 1, 4), True)}
    # layer 3: stage dp 2 in pipeline 0, tp 1 everywhere -> shard all-reduce among the three holders
    assert {(g, f) for g, n, f in items if n == "layers.3.mlp.fc1.weight"} == {((2, 3, 5), False)}
    assert all(len(g) > 1 for g in lay.sync_groups())


def test_checkpoint_writers_cover_every_tensor(rt, load):
    plan, model = load(rt.make_plan(rt.GQA_TIED, [
        {"micro_batches": 2, "stages": [rt.stage(0, 1, [0, 1], tp=2), rt.stage(1, 3, [2])]},
        {"micro_batches": 2, "stages": [rt.stage(0, 3, [3, 4], tp=2)]}]))
    lay = Layout(plan, model)
    covered: dict[str, set[int]] = {}
    for specs in lay.checkpoint_writers.values():
        for s in specs:
            n = s.shape[s.dim] if s.dim is not None else 1
            covered.setdefault(s.name, set()).update(range(s.start, s.stop) if s.dim is not None else range(n))
    for name, hs in lay.holders.items():
        spec = hs[0][1]
        want = spec.shape[spec.dim] if spec.dim is not None else 1
        assert covered[name] == set(range(want)), name


@pytest.mark.parametrize("stages,micro,first_backward", [(4, 6, 4), (4, 2, 2), (1, 3, 1)])
def test_1f1b_warmup_and_order(rt, load, stages, micro, first_backward):
    """Stage 0 of S stages runs min(S-1, M) warm-up forwards, then alternates."""
    per = 4 // stages
    doc = rt.make_plan(rt.DENSE, [{"micro_batches": micro, "stages": [
        rt.stage(i * per, (i + 1) * per, [i]) for i in range(stages)]}], gbs=2 * micro)
    plan, model = load(doc)
    lay = Layout(plan, model)
    sched = lay.schedule(lay.roles[0])
    assert next(i for i, (k, _) in enumerate(sched) if k == "B") == first_backward
    assert [m for k, m in sched if k == "F"] == list(range(micro))
    assert [m for k, m in sched if k == "B"] == list(range(micro))


def test_megatron_export_homogeneous_uneven_ends(rt, load):
    model = dict(rt.DENSE, num_layers=8)
    doc = rt.make_plan(model, [{"micro_batches": 2, "stages": [
        rt.stage(0, 1, [4 * p, 4 * p + 1], tp=2), rt.stage(1, 8, [4 * p + 2, 4 * p + 3], tp=2)]}
        for p in range(2)], gbs=8, zero_stage=1)
    plan, m = load(doc)  # two identical pipelines: pp 2, tp 2, dp 2, first stage 1 layer of 8
    mx = megatron_export(plan, m)
    assert mx.ok, mx.reasons
    a = mx.args
    val = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}
    assert val["--tensor-model-parallel-size"] == "2" and val["--pipeline-model-parallel-size"] == "2"
    assert val["--decoder-first-pipeline-num-layers"] == "1"
    assert val["--micro-batch-size"] == "2" and val["--global-batch-size"] == "8"
    assert "--use-distributed-optimizer" in a and "--group-query-attention" in a
    assert sorted(x["rank"] for x in mx.rank_map) == list(range(8))


def test_megatron_export_refuses_what_it_cannot_express(rt, load):
    plan, m = load(_mixed(rt))
    mx = megatron_export(plan, m)
    assert not mx.ok
    text = "; ".join(mx.reasons)
    assert "heterogeneous pipelines" in text and "per-stage tp" in text and "per-stage dp" in text
    plan, m = load(rt.make_plan(dict(rt.DENSE, num_layers=7), [{"micro_batches": 4, "stages": [
        rt.stage(0, 1, [0]), rt.stage(1, 3, [1]), rt.stage(3, 6, [2]), rt.stage(6, 7, [3])]}]))
    assert any("uneven middle stages" in r for r in megatron_export(plan, m).reasons)


def test_torchrun_export_rank_map(rt, load):
    cluster_doc = {"nodes": [{"name": "a", "gpu": "A100-40", "gpus_per_node": 2},
                             {"name": "b", "gpu": "V100-16", "gpus_per_node": 4}]}
    from arachne.plan import plan_from_dict, validate_plan
    from arachne.spec.cluster import cluster_from_dict

    cl = cluster_from_dict(cluster_doc)
    plan = plan_from_dict(rt.make_plan(rt.DENSE, [{"micro_batches": 4, "stages": [
        {"layers": [0, 2], "devices": ["b:1", "b:0"], "tp": 2}, {"layers": [2, 4], "devices": ["a:1"]}]}]))
    model = validate_plan(plan, cl)
    doc = torchrun_export(plan, model, cl, "plan.json", "cluster.yaml")
    assert [n["node"] for n in doc["nodes"]] == ["a", "b"]
    assert doc["nodes"][1]["devices"] == ["b:0", "b:1"] and doc["nodes"][1]["first_rank"] == 1
    assert "--nproc-per-node=2" in doc["nodes"][1]["command"] and "--node-name b" in doc["nodes"][1]["command"]
    by_dev = {r["device"]: r for r in doc["ranks"]}
    assert by_dev["a:1"]["rank"] == 0 and by_dev["b:0"]["rank"] == 1 and by_dev["b:1"]["tp_rank"] == 0
