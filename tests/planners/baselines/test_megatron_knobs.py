"""The Megatron grid's Megatron-LM knobs (docs/baselines.md §2): sequence parallelism, the distributed
optimizer and overlap, the least recomputation that fits, interleaving, context parallelism, ep/etp; every
plan valid; never slower than the version-1 grid."""

from __future__ import annotations

from functools import cache

import pytest

from arachne.cost import CostModel
from arachne.errors import NoFeasiblePlanError
from arachne.plan import Plan, plan_errors
from arachne.plan_rules import uses_v2
from arachne.planners.baselines.megatron_knobs import (
    MegatronKnobs,
    cp_menu,
    expert_menu,
    recompute_rungs,
    stage_layers,
    virtual_menu,
)
from arachne.planners.harness import run_planner
from arachne.planners.protocol import PlannerResult, SearchBudget
from arachne.planners.registry import get_planner, planner_factory
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import load_model

CLUSTERS = {
    "a80x8": [{"name": "a", "gpu": "A100-80", "gpus_per_node": 8}],
    "v16x8": [{"name": "v{i}", "count": 2, "gpu": "V100-16", "gpus_per_node": 4}],
    "mixed8": [{"name": "a", "gpu": "A100-40", "gpus_per_node": 4}, {"name": "v", "gpu": "V100-16", "gpus_per_node": 4}],
    "t4x8": [{"name": "t{i}", "count": 2, "gpu": "T4", "gpus_per_node": 4}],
    "a40x16": [{"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8}],
}
# (cluster, model, global batch, sequence length): small problems, each planned in a few seconds
PROBLEMS = {
    "dense": ("a80x8", "GPT-3-1.3B", 64, 2048),
    "tight": ("v16x8", "LLaMA-2-7B", 16, 2048),          # full recomputation and interleaving needed
    "deep": ("v16x8", "GPT-3-2.7B", 16, 2048),           # few micro-batches: interleaving pays
    "mixed": ("mixed8", "GPT-3-1.3B", 128, 2048),
    "moe": ("a80x8", "Qwen1.5-MoE-A2.7B", 64, 2048),
    "long": ("a80x8", "Llama-3.1-8B", 8, 32768),         # context parallelism
}


@cache
def cluster(name: str) -> Cluster:
    return cluster_from_dict({"name": name, "nodes": CLUSTERS[name]})


@cache
def searched(problem: str, planner: str = "megatron", options: tuple = ()) -> PlannerResult:
    """The planner's ranked plans (top 8)."""
    cl, model, gbs, seq = PROBLEMS[problem]
    planner_factory(planner)
    c = cluster(cl)
    return get_planner(planner, **dict(options)).plan(
        c, load_model(model), Job(global_batch_size=gbs, sequence_length=seq), CostModel(c),
        SearchBudget(time_budget_s=120, top_k=8))


@cache
def best(problem: str, planner: str = "megatron", options: tuple = ()):
    """(plan, estimate) that ``run_planner`` returns."""
    cl, model, gbs, seq = PROBLEMS[problem]
    planner_factory(planner)
    c = cluster(cl)
    plan, est, _ = run_planner(planner, c, load_model(model), Job(global_batch_size=gbs, sequence_length=seq),
                               CostModel(c), SearchBudget(time_budget_s=120), **dict(options))
    return plan, est


def stages(plan: Plan):
    return [st for p in plan.pipelines for st in p.stages]


# ---- every plan is valid and uses the knobs as Megatron-LM would --------------------------------------
@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_plans_validate_and_fit(problem: str) -> None:
    res = searched(problem)
    cl, model, _, _ = PROBLEMS[problem]
    assert res.plans and not res.stats.timed_out
    assert res.scores == sorted(res.scores)
    cm = CostModel(cluster(cl))
    for plan in res.plans:
        assert plan_errors(plan, cluster(cl), load_model(model)) == []
        assert cm.estimate(plan).fits
        (pipe,) = plan.pipelines  # one pipeline structure for every replica
        assert len({(st.tp, st.dp_size, st.cp, st.ep, st.etp, st.recompute, st.recompute_layers)
                     for st in pipe.stages}) == 1


@pytest.mark.parametrize("problem", ["dense", "tight", "deep", "mixed", "moe"])
@pytest.mark.parametrize("planner", ["megatron", "megatron-oblivious"])
def test_sequence_parallel_with_tp_and_the_distributed_optimizer_with_replicas(problem: str, planner: str) -> None:
    for plan in searched(problem, planner).plans:
        for st in stages(plan):
            assert st.sequence_parallel == (st.tp > 1)
            if st.dp_size * st.cp > 1:
                assert plan.zero_stage == 1 and plan.overlap_grad_reduce and plan.overlap_param_gather


@pytest.mark.parametrize("problem", ["dense", "tight", "deep", "moe"])
def test_sequence_parallelism_is_never_slower_and_saves_memory(problem: str) -> None:
    """Why SP is always on with tp > 1: under the common model it costs no time and saves memory."""
    cl = PROBLEMS[problem][0]
    cm = CostModel(cluster(cl))
    checked = 0
    for plan in searched(problem).plans:
        if not any(st.sequence_parallel for st in stages(plan)):
            continue
        off = plan.model_copy(update={"pipelines": tuple(
            p.model_copy(update={"stages": tuple(st.model_copy(update={"sequence_parallel": False})
                                                 for st in p.stages)}) for p in plan.pipelines)})
        on_est, off_est = cm.estimate(plan), cm.estimate(off)
        assert on_est.iteration_time_s <= off_est.iteration_time_s * (1 + 1e-12)
        assert on_est.max_memory_bytes < off_est.max_memory_bytes
        checked += 1
    if problem in ("tight", "deep"):
        assert checked


def _fits_with(cm: CostModel, plan: Plan, **update) -> bool:
    new = plan.model_copy(update={"pipelines": tuple(
        p.model_copy(update={"stages": tuple(st.model_copy(update=update) for st in p.stages)})
        for p in plan.pipelines)})
    return cm.estimate(new).fits


@pytest.mark.parametrize("problem", ["tight", "dense"])
def test_recomputation_is_the_least_that_fits(problem: str) -> None:
    """Selective or full recomputation only when none does not fit; full with the fewest blocks that fit."""
    cm = CostModel(cluster(PROBLEMS[problem][0]))
    recomputed = 0
    for plan in searched(problem).plans:
        st = stages(plan)[0]
        if not st.recompute:
            continue
        recomputed += 1
        assert not _fits_with(cm, plan, recompute=False, recompute_layers=None)
        if st.recompute is True and st.recompute_layers is not None and st.recompute_layers > 1:
            assert not _fits_with(cm, plan, recompute_layers=st.recompute_layers - 1)
        if st.recompute is True and st.recompute_layers is None and plan.pipelines[0].virtual_stages == 1:
            fewest = min(s.num_layers for s in stages(plan))
            if fewest > 1:
                assert not _fits_with(cm, plan, recompute_layers=fewest - 1)
    if problem == "tight":
        assert recomputed


# ---- never slower than the version-1 grid -------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("problem", ["dense", "tight", "deep", "mixed", "moe", "long"])
def test_never_slower_than_the_version_one_grid(problem: str) -> None:
    """The version-1 grid's every fitting point is in the new grid with SP, ZeRO-1 and overlap (never slower,
    never more memory) and at most as much recomputation, so the best plan can only get faster."""
    _, new = best(problem)
    try:
        plan_v1, old = best(problem, options=(("v1", True),))
    except NoFeasiblePlanError:  # e.g. "tight": only partial recomputation or interleaving fits
        return
    assert not uses_v2(plan_v1)
    assert new.iteration_time_s <= old.iteration_time_s * (1 + 1e-9)


def test_the_version_one_grid_writes_version_one_plans() -> None:
    for plan in searched("moe", options=(("v1", True),)).plans:
        assert not uses_v2(plan)
        assert all(st.etp is None and st.cp == 1 for st in stages(plan))


# ---- interleaving, context parallelism, experts ------------------------------------------------------------
def test_interleaving_pays_when_micro_batches_are_few() -> None:
    plan, est = best("deep")
    (pipe,) = plan.pipelines
    S, v = len(pipe.stages), pipe.virtual_stages
    assert v > 1, "with 8 micro-batches on a deep pipeline the interleaved schedule should win"
    assert pipe.micro_batches % S == 0 and load_model("GPT-3-2.7B").num_layers % (S * v) == 0
    _, plain = best("deep", options=(("max_virtual_stages", 1),))
    assert est.iteration_time_s < plain.iteration_time_s


def test_long_sequences_use_context_parallelism() -> None:
    """32k-token sequences of an 8B model on one 8-GPU node: the grid picks cp > 1, and it beats the best
    plan without cp."""
    plan, est = best("long")
    cps = {st.cp for st in stages(plan)}
    assert cps != {1}, plan.to_json()
    seq = PROBLEMS["long"][3]
    assert all(seq % (2 * c) == 0 for c in cps)
    _, without = best("long", options=(("context_parallel", False),))
    assert est.iteration_time_s < without.iteration_time_s


def test_context_parallel_only_for_long_sequences() -> None:
    knobs = MegatronKnobs()
    assert cp_menu(4096, knobs) == [1]
    assert cp_menu(8192, knobs) == [1, 2, 4, 8, 16]
    assert cp_menu(32768, MegatronKnobs(v1=True)) == [1]
    assert cp_menu(8192 + 2, knobs) == [1]  # 2 cp must divide the sequence


def test_virtual_stage_menu() -> None:
    knobs = MegatronKnobs()
    assert virtual_menu(24, 1, knobs) == [1]
    assert virtual_menu(24, 2, knobs) == [1, 2, 3, 4]
    assert virtual_menu(24, 4, knobs) == [1, 2, 3]
    assert virtual_menu(24, 3, MegatronKnobs(max_virtual_stages=1)) == [1]
    layers = stage_layers(24, 3, 2)
    assert layers[0] == ((0, 4), (12, 16)) and layers[2] == ((8, 12), (20, 24))
    assert recompute_rungs([6, 6], 1) == [1, 2, 3, 4, 5, 0] and recompute_rungs([6, 6], 2) == [0]


def test_expert_menu_follows_the_v2_rule() -> None:
    model = load_model("Qwen1.5-MoE-A2.7B")
    pairs = expert_menu(model, tp=2, cp=1, dp=4, knobs=MegatronKnobs())
    for ep, etp in pairs:
        e = etp or 2
        assert model.num_experts % ep == 0 and (4 * 1 * 2) % (ep * e) == 0
    assert (4, None) in pairs and (4, 1) in pairs
    assert expert_menu(model, 2, 1, 4, MegatronKnobs(v1=True)) == [(1, None), (2, None), (4, None)]
    assert expert_menu(load_model("GPT-3-1.3B"), 2, 1, 4, MegatronKnobs()) == [(1, None)]


def test_moe_plans_respect_the_expert_layout() -> None:
    res = searched("moe")
    assert any(st.ep > 1 for p in res.plans for st in stages(p))
    for plan in res.plans:
        for st in stages(plan):
            assert (st.dp_size * st.cp * st.tp) % (st.ep * st.etp_size) == 0


def test_the_knobs_can_be_switched_off() -> None:
    opts = (("sequence_parallel", False), ("overlap", False), ("zero", False), ("max_virtual_stages", 1),
            ("context_parallel", False), ("expert_tp", False), ("recompute", False), ("moe_overlap", False))
    for plan in searched("moe", options=opts).plans:
        assert not uses_v2(plan) and plan.zero_stage == 0
        assert all(not st.recompute for st in stages(plan))


def test_overlapped_expert_all_to_alls_only_where_megatron_core_pairs_them() -> None:
    """The grid's last pass adds ``overlap_moe_comm`` (--overlap-moe-expert-parallel-comm) to fitting MoE plans
    with ep > 1 that Megatron-Core pairs (pp = 1 or interleaved, no full recomputation), never to others; every
    plan it returns keeps the megatron runtime's rules."""
    from arachne.planners.baselines.megatron_knobs import MegatronKnobs, moe_overlap_variant
    from arachne.spec.runtimes import Legality, moe_overlap_errors

    knobs, moe = MegatronKnobs(), load_model("Qwen1.5-MoE-A2.7B")
    devs = [f"n{i // 8}:{i % 8}" for i in range(16)]

    def plan(pp: int, v: int = 1, ep: int = 4, rec=False, model: str = "Qwen1.5-MoE-A2.7B") -> Plan:
        per = 16 // pp
        L = load_model(model).num_layers
        if v == 1:
            layers = [[L * s // pp, L * (s + 1) // pp] for s in range(pp)]
        else:
            c = L // (pp * v)
            layers = [[[(j * pp + s) * c, (j * pp + s + 1) * c] for j in range(v)] for s in range(pp)]
        return Plan.model_validate({
            "format": "arachne-plan/2", "model": model, "global_batch_size": 64, "sequence_length": 2048,
            "micro_batch_size": per, "precision": "bf16", "zero_stage": 1, "schedule": "1f1b",
            "pipelines": [{"micro_batches": 64 // per, "virtual_stages": v, "stages": [
                {"layers": layers[s], "devices": devs[s * per:(s + 1) * per], "tp": 1, "dp": per,
                 "ep": ep, "recompute": rec} for s in range(pp)]}]})

    assert moe_overlap_variant(plan(1), moe, knobs).overlap_moe_comm
    assert moe_overlap_variant(plan(2, v=2), moe, knobs).overlap_moe_comm
    assert moe_overlap_variant(plan(2), moe, knobs) is None  # pp 2 without interleaving
    assert moe_overlap_variant(plan(1, rec=True), moe, knobs) is None
    assert moe_overlap_variant(plan(1, rec="selective"), moe, knobs) is not None
    assert moe_overlap_variant(plan(1, ep=1), moe, knobs) is None
    assert moe_overlap_variant(plan(1), moe, MegatronKnobs(moe_overlap=False)) is None
    rules = Legality.of("megatron")
    for p in searched("moe").plans:
        if p.overlap_moe_comm:
            assert moe_overlap_errors(p, "megatron") == []
        assert not [e for e in rules.errors(p) if "overlap_moe_comm" in e[1] or e[0] == "overlap_moe_comm"]


@pytest.mark.parametrize("problem,knob", [("deep", ("max_virtual_stages", 1)), ("long", ("context_parallel", False))])
def test_the_arachne_runtime_gets_the_best_grid_point_it_can_run(problem: str, knob: tuple) -> None:
    """Where the grid's best plan interleaves (``deep``) or uses cp (``long``), a run under the arachne runtime
    (neither) gets the grid's best plan without them, even keeping one plan: before the grid learnt the rules,
    its top plans were all ones the runtime refuses, and it returned none."""
    from arachne.spec.runtimes import Legality

    cl, model, gbs, seq = PROBLEMS[problem]
    planner_factory("megatron")
    c = cluster(cl)
    plan, est, _ = run_planner("megatron", c, load_model(model), Job(global_batch_size=gbs, sequence_length=seq),
                               CostModel(c), SearchBudget(time_budget_s=120, top_k=1),
                               legality=Legality.of("arachne"))
    assert not Legality.of("arachne").errors(plan, c)
    _, without = best(problem, options=(knob,))
    assert est.iteration_time_s == pytest.approx(without.iteration_time_s, rel=1e-9)
    assert est.iteration_time_s > best(problem)[1].iteration_time_s  # the rules cost something here
