"""The seeds' deep whole-expert pipelines of an MoE model: replicated as the type allows, at ranked sizes."""

from __future__ import annotations

import pytest
from planner_cases import throughputs
from test_seeds import ctx_for

from arachne.planners.arachne import seeds
from arachne.planners.protocol import Deadline

ROB018 = {"name": "rob-018", "nodes": [
    {"name": "accel-x2-{i}", "count": 39, "gpu": "Accel-128G", "gpus_per_node": 2},
    {"name": "a800-x8-{i}", "count": 6, "gpu": "A800", "gpus_per_node": 8},
    {"name": "a10g-x1-{i}", "count": 160, "gpu": "A10G", "gpus_per_node": 1, "inter_node_gbps": 3.125},
    {"name": "h200-x1-{i}", "count": 218, "gpu": "H200", "gpus_per_node": 1, "inter_node_gbps": 3.125,
     "zone": "row-3"}],
    "gpu_types": [{"name": "Accel-128G", "memory_gb": 128, "peak_tflops": 69.8, "memory_bandwidth_gbps": 567,
                   "intra_node_gbps": 16, "inter_node_gbps": 12.5, "intra_node_link": "pcie", "nics_per_node": 2}]}
"""Fresh hold-out seed200/rob-018: 504 GPUs, 218 of them H200 in single-GPU nodes on 3.125 GB/s NICs."""


def test_an_moe_models_whole_expert_pipelines_are_as_many_as_the_type_holds():
    """fresh hold-out seed200/rob-018 (Qwen3-235B-A22B, batch 2,048 x 512): Megatron's grid runs two pipelines of
    94 one-block stages (dp 2) over the single-H200 nodes at micro-batch 4, 71,677 tokens/s; the family priced one
    such pipeline (94 GPUs, 51,153) and nothing faster."""
    ctx = ctx_for([("H200", 218, 1, 3.125)], model="Qwen3-235B-A22B", gbs=2048, seq=512)
    cm = ctx.cost_model
    plan, est = max(seeds.seed_plans(ctx, Deadline(60, lambda: float(cm.estimates))),
                    key=lambda r: r[1].tokens_per_s)
    assert {len(p.stages) for p in plan.pipelines} == {94} and len(plan.devices) == 188
    assert not seeds.sharded(plan) and est.tokens_per_s > 70_000


@pytest.mark.slow
def test_the_planner_reaches_megatron_on_qwen3_235b_over_two_deep_whole_expert_pipelines():
    runs = throughputs(ROB018, "Qwen3-235B-A22B", 2048, 512, ("arachne", "megatron"))
    assert runs["arachne"] >= 0.999 * runs["megatron"]


def test_shared_gain_counts_the_bubble_each_copy_adds():
    """Two copies of a pipeline each run half its micro-batches over the same depth: a deep pipeline over few
    micro-batches gains little (DeepSeek-V3's 61 stages over 64: 1.35x, which its gradient sync then eats), over
    many nearly twice (Qwen3-235B's 94 over 512: 1.73x); a copy with no micro-batch gains nothing."""
    assert seeds.shared_gain(512, 2, 94) == pytest.approx(1.7335, abs=1e-4)
    assert seeds.shared_gain(64, 2, 61) == pytest.approx(1.3478, abs=1e-4)
    assert seeds.shared_gain(1000, 4, 1) == pytest.approx(4.0)
    assert seeds.shared_gain(3, 4, 8) == 0.0
