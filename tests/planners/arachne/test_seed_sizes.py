"""The micro-batch sizes the seeds price a template at, and the deep whole-expert pipelines of an MoE model."""

from __future__ import annotations

import pytest
from planner_cases import throughputs
from test_seeds import CLOUD, ctx_for

from arachne.planners.arachne import seeds
from arachne.planners.arachne.template import Group, Slot, Template
from arachne.planners.protocol import Deadline

ROB003 = {"name": "rob-003", "nodes": [
    {"name": "h800-x1-{i}", "count": 30, "gpu": "H800", "gpus_per_node": 1},
    {"name": "a800-x1-{i}", "count": 40, "gpu": "A800", "gpus_per_node": 1, "inter_node_gbps": 3.125},
    {"name": "a100-80-x8-{i}", "count": 11, "gpu": "A100-80"},
    {"name": "a10g-x4-{i}", "count": 15, "gpu": "A10G", "gpus_per_node": 4, "zone": "row-1"},
    {"name": "v100-16-x1-{i}", "count": 37, "gpu": "V100-16", "gpus_per_node": 1},
    {"name": "h100-x1-{i}", "count": 13, "gpu": "H100", "gpus_per_node": 1},
    {"name": "h100-x8-{i}", "count": 2, "gpu": "H100", "zone": "row-0"},
    {"name": "h800-x8-{i}", "count": 4, "gpu": "H800", "inter_node_gbps": 100, "zone": "row-4"},
    {"name": "v100-16-x2-{i}", "count": 19, "gpu": "V100-16", "gpus_per_node": 2, "zone": "row-2"},
    {"name": "a800-x2-{i}", "count": 20, "gpu": "A800", "gpus_per_node": 2, "inter_node_gbps": 12.5}]}
"""Fresh hold-out seed157/rob-003: 394 GPUs of six types in ten classes."""

ROB018 = {"name": "rob-018", "nodes": [
    {"name": "accel-x2-{i}", "count": 39, "gpu": "Accel-128G", "gpus_per_node": 2},
    {"name": "a800-x8-{i}", "count": 6, "gpu": "A800", "gpus_per_node": 8},
    {"name": "a10g-x1-{i}", "count": 160, "gpu": "A10G", "gpus_per_node": 1, "inter_node_gbps": 3.125},
    {"name": "h200-x1-{i}", "count": 218, "gpu": "H200", "gpus_per_node": 1, "inter_node_gbps": 3.125,
     "zone": "row-3"}],
    "gpu_types": [{"name": "Accel-128G", "memory_gb": 128, "peak_tflops": 69.8, "memory_bandwidth_gbps": 567,
                   "intra_node_gbps": 16, "inter_node_gbps": 12.5, "intra_node_link": "pcie", "nics_per_node": 2}]}
"""Fresh hold-out seed200/rob-018: 504 GPUs, 218 of them H200 in single-GPU nodes on 3.125 GB/s NICs."""


def test_the_smallest_size_of_a_one_stage_template_is_its_largest():
    """A deep pipeline's smallest micro-batch shrinks its bubble; one stage has none, and its many small
    micro-batches only cost time (fresh hold-out seed157/rob-003: Mixtral-8x7B as one stage of tp 2 x dp 64 over
    the H100, H800 and A100 nodes of 8 is 2.4x faster as one micro-batch of 512 than as eight of 64)."""
    ctx = ctx_for(CLOUD)
    deep = Template((Group((Slot(0, 1),) * 4, 1),))
    wide = Template((Group((Slot(0, 1),), 8),))
    assert seeds.seed_sizes(deep, ctx, {}, smallest=True) == [min(seeds.mbs_candidates(deep, ctx.job))]
    assert seeds.seed_sizes(wide, ctx, {}, smallest=True) == [max(seeds.mbs_candidates(wide, ctx.job))]


def test_an_moe_models_whole_expert_pipelines_are_as_many_as_the_type_holds():
    """fresh hold-out seed200/rob-018 (Qwen3-235B-A22B, batch 2,048 x 512): Megatron's grid runs two pipelines of
    94 one-block stages (dp 2) over the single-H200 nodes at micro-batch 4, 71,677 tokens/s; the family priced one
    such pipeline (94 GPUs, 51,153) at the sizes of a replicated template, and nothing faster."""
    ctx = ctx_for([("H200", 218, 1, 3.125)], model="Qwen3-235B-A22B", gbs=2048, seq=512)
    cm = ctx.cost_model
    plan, est = max(seeds.seed_plans(ctx, Deadline(60, lambda: float(cm.estimates))),
                    key=lambda r: r[1].tokens_per_s)
    assert {len(p.stages) for p in plan.pipelines} == {94} and len(plan.devices) == 188
    assert not seeds.sharded(plan) and est.tokens_per_s > 70_000


@pytest.mark.slow
def test_the_planner_reaches_megatron_oblivious_on_mixtral_over_one_stage_of_node_wide_tp():
    runs = throughputs(ROB003, "Mixtral-8x7B", 512, 1024, ("arachne", "megatron-oblivious"))
    assert runs["arachne"] >= 0.999 * runs["megatron-oblivious"]


@pytest.mark.slow
def test_the_planner_reaches_megatron_on_qwen3_235b_over_two_deep_whole_expert_pipelines():
    runs = throughputs(ROB018, "Qwen3-235B-A22B", 2048, 512, ("arachne", "megatron"))
    assert runs["arachne"] >= 0.999 * runs["megatron"]
