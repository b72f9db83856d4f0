"""The compute ceiling: no plan the cost model prices may beat it, and it is not vacuous."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from arachne.cost import CostModel
from arachne.cost.ceiling import throughput_ceiling
from arachne.plan import Pipeline, Plan, Stage
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.model import model_catalog


def two_type_cluster(per_node: int, nodes: int):
    """A fast and a half-speed GPU type, known only by their features (so priced analytically)."""
    def gpu(name: str, scale: float) -> dict:
        return {"name": name, "memory_gb": 80, "peak_tflops": 300 * scale, "memory_bandwidth_gbps": 2000 * scale,
                "intra_node_gbps": 600 * scale, "inter_node_gbps": 50 * scale, "fp32_tflops": 20 * scale,
                "tf32_tflops": 150 * scale}
    return cluster_from_dict({
        "name": "t", "gpu_types": [gpu("Fast", 1.0), gpu("Slow", 0.5)],
        "nodes": [{"name": "f{i}", "count": nodes, "gpu": "Fast", "gpus_per_node": per_node},
                  {"name": "s{i}", "count": nodes, "gpu": "Slow", "gpus_per_node": per_node}]})


PROFILED = cluster_from_dict({"name": "p", "nodes": [
    {"name": "a{i}", "count": 4, "gpu": "A100-40", "gpus_per_node": 4},
    {"name": "v{i}", "count": 4, "gpu": "V100-16", "gpus_per_node": 4}]})
ANALYTIC = two_type_cluster(per_node=4, nodes=4)
CASES = {  # (cluster, model, precision, prefixes of the two GPU types' nodes)
    "profiled-dense": (PROFILED, "OPT-350M", "fp32", ("a", "v")),
    "analytic-dense": (ANALYTIC, "GPT-3-1.3B", "bf16", ("f", "s")),
    "analytic-moe": (ANALYTIC, "Qwen1.5-MoE-A2.7B", "bf16", ("f", "s")),
}


@st.composite
def random_plan(draw, case: str) -> tuple[Plan, CostModel]:
    """A valid plan with 1-3 pipelines of 1-4 stages, any GPU type, tp, dp, ep, recompute, mbs."""
    cl, model_name, precision, prefixes = CASES[case]
    model = model_catalog().get(model_name)
    L = model.num_layers
    free = {p: [f"{p}{n}:{i}" for n in range(4) for i in range(4)] for p in prefixes}
    pipes = []
    for _ in range(draw(st.integers(1, 3))):
        cuts = sorted(draw(st.lists(st.integers(1, L - 1), max_size=3, unique=True)))
        mbs = draw(st.sampled_from([1, 2, 4, 8]))
        stages = []
        for a, z in zip([0, *cuts], [*cuts, L]):
            kind = draw(st.sampled_from(prefixes))
            tp = draw(st.sampled_from([1, 2, 4]))
            dp = draw(st.sampled_from([d for d in (1, 2, 4) if mbs % d == 0]))
            ep = draw(st.sampled_from([e for e in (1, 2, 4) if dp % e == 0])) if model.is_moe else 1
            pool = free[kind]
            while pool and int(pool[0].split(":")[1]) % tp:  # keep each TP group inside its node
                pool.pop(0)
            assume(len(pool) >= tp * dp)
            devs = tuple(pool[:tp * dp])
            del pool[:tp * dp]
            assume(all(d.split(":")[0] == g[0].split(":")[0] for g in (devs[i:i + tp] for i in range(0, len(devs), tp))
                       for d in g))
            stages.append(Stage(layers=(a, z), devices=devs, tp=tp, dp=dp, ep=ep, recompute=draw(st.booleans())))
        pipes.append(Pipeline(micro_batches=draw(st.integers(1, 6)), stages=tuple(stages), micro_batch_size=mbs))
    gbs = sum(p.micro_batches * p.micro_batch_size for p in pipes)
    plan = Plan(model=model_name, global_batch_size=gbs, sequence_length=2048, micro_batch_size=pipes[0].micro_batch_size,
                precision=precision, zero_stage=draw(st.sampled_from([0, 1])), pipelines=tuple(pipes))
    return plan, CostModel(cl)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(CASES)).flatmap(random_plan))
def test_no_plan_beats_the_ceiling(drawn):
    plan, cm = drawn
    try:
        est = cm.estimate(plan)
    except ValueError:
        assume(False)
    model = model_catalog().get(plan.model)
    ceiling = throughput_ceiling(cm, model, plan.global_batch_size, plan.sequence_length, plan.precision)
    assert est.tokens_per_s <= ceiling.tokens_per_s * (1 + 1e-9)


def test_ceiling_is_near_a_compute_bound_plan():
    """One GPU, one stage, a large batch: little but compute, so it must come close to the ceiling."""
    cl = cluster_from_dict({"nodes": [{"name": "h{i}", "count": 1, "gpu": "H100", "gpus_per_node": 1}]})
    cm = CostModel(cl)
    plan = Plan(model="GPT-3-1.3B", global_batch_size=64, sequence_length=2048, micro_batch_size=8,
                pipelines=(Pipeline(micro_batches=8, stages=(Stage(layers=(0, 24), devices=("h0:0",), tp=1),)),))
    est = cm.estimate(plan, validate=False)
    ceiling = throughput_ceiling(cm, model_catalog().get("GPT-3-1.3B"), 64, 2048)
    assert est.tokens_per_s <= ceiling.tokens_per_s
    assert est.tokens_per_s >= 0.8 * ceiling.tokens_per_s
    assert next(iter(ceiling.alone_tokens_per_s.values())) >= ceiling.tokens_per_s * (1 - 1e-9)


def test_two_types_add_up_and_specialise_only_up_to_the_sum():
    cl = two_type_cluster(per_node=4, nodes=1)
    cm = CostModel(cl)
    c = throughput_ceiling(cm, model_catalog().get("GPT-3-1.3B"), 64, 2048)
    total = sum(c.alone_tokens_per_s.values())
    assert total * (1 - 1e-6) <= c.tokens_per_s <= total * 1.05
