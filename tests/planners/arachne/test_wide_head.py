"""The wide head's gate: a one-layer last stage with the head that paces its pipeline, priced again at twice the tp."""

from __future__ import annotations

import pytest

from arachne.cost import CostModel
from arachne.planners.arachne.completion.price import head_bound, price_template
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import Group, Slot, Template
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from arachne.spec.runtimes import Legality


def a10g_accel_cluster():
    """seed36-rerun/rob-006: 16 four-GPU nodes of a features-only 40 GB accelerator (no bf16, 3 Gb/s between
    nodes) and 8 eight-GPU A10G nodes."""
    return cluster_from_dict({"name": "rob-006", "gpu_types": [
        {"name": "Accel-98c8-40G-c0", "memory_gb": 40, "peak_tflops": 53.8, "memory_bandwidth_gbps": 1119,
         "intra_node_gbps": 300, "inter_node_gbps": 100, "intra_node_link": "nvlink", "bf16": False}],
        "nodes": [{"name": "accel-{i}", "count": 16, "gpu": "Accel-98c8-40G-c0", "gpus_per_node": 4,
                   "inter_node_gbps": 3.125},
                  {"name": "a10g-{i}", "count": 8, "gpu": "A10G"}]})


def test_a_head_stage_is_judged_against_the_even_share_not_the_greedy_fill():
    # OPT-350M in 8 pipelines of 8 A10G and 8 accelerator stages: the last stage (a block and a 50k-vocabulary
    # head on one accelerator) sets the bound, and the split's greedy fill loads every earlier stage up to it, so the
    # last stage is not 1.25x slower than the slowest other; it is against their mean, the even share
    cluster = a10g_accel_cluster()
    model, job = model_catalog().get("OPT-350M"), Job(global_batch_size=96, sequence_length=512)
    ctx = PlanningContext(cluster, model, job, CostModel(cluster))
    a10g, accel = (next(c.index for c in ctx.classes if c.gpu.name.startswith(n)) for n in ("A10G", "Accel"))
    tpl = Template((Group(tuple(Slot(a10g, 1) for _ in range(8)) + tuple(Slot(accel, 1) for _ in range(8)), 8),))
    plain = price_template(tpl, ctx, heads=False)
    last = [s for s in plain[1].stages if s.pipeline == 0][-1]
    assert last.layers[1] - last.layers[0] == 1
    assert not head_bound(plain[1]) and head_bound(plain[1], even_share=True)  # the slowest other is near it
    plan, est = price_template(tpl, ctx)
    assert est.tokens_per_s > 1.05 * plain[1].tokens_per_s
    assert plan.pipelines[0].stages[-1].tp == 2


@pytest.mark.slow
def test_the_planner_passes_sailors_thirteen_stage_pipelines_over_a10g_and_the_accelerator():
    """seed36-rerun/rob-006: Sailor's 8 pipelines of 13 stages (an A10G, six accelerators, five A10G, the last
    block and the head on two A10G at tp 2) were 1.053x arachne's A10G-only plan while the wide head's gate
    compared the head's stage with the slowest other stage."""
    cluster = a10g_accel_cluster()
    model, job = model_catalog().get("OPT-350M"), Job(global_batch_size=96, sequence_length=512)
    cm = CostModel(cluster)
    runs = {name: run_planner(name, cluster, model, job, cm, SearchBudget(time_budget_s=5.0), Legality.of("arachne"))
            for name in ("arachne", "sailor")}
    assert runs["arachne"][1].tokens_per_s >= runs["sailor"][1].tokens_per_s
