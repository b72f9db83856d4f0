"""The arachne planner: completion rules, search modes, the oracle bound, the policy file, training."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from arachne.cost import CostModel
from arachne.plan import validate_plan
from arachne.planners.arachne.actions import Action, State, class_actions
from arachne.planners.arachne.completion.batch import share_micro_batches, share_samples
from arachne.planners.arachne.completion.place import place
from arachne.planners.arachne.completion.price import price_template
from arachne.planners.arachne.completion.split import split_layers
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.learned.features import FEATURE_DIM, FeatureBuilder
from arachne.planners.arachne.learned.policy import Policy
from arachne.planners.arachne.template import Group, Slot, Template
from arachne.planners.arachne.work_clock import Work
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from arachne.spec.runtimes import Legality


def small_cluster():
    return cluster_from_dict({"name": "s", "nodes": [
        {"name": "a{i}", "count": 1, "gpu": "A100-40", "gpus_per_node": 4},
        {"name": "v{i}", "count": 1, "gpu": "V100-16", "gpus_per_node": 4}]})


def ctx_for(model="GPT-3-1.3B", gbs=64, seq=2048, cluster=None):
    cl = cluster or small_cluster()
    job = Job(global_batch_size=gbs, sequence_length=seq)
    return PlanningContext(cl, model_catalog().get(model), job, CostModel(cl))


def test_device_classes_are_fastest_first():
    ctx = ctx_for()
    assert [c.gpu.name for c in ctx.classes] == ["A100-SXM4-40GB", "V100-SXM2-16GB"]


def test_split_balances_to_stage_speed():
    ctx = ctx_for()
    fast = ctx.slot_profile(0, 1, 1, 1, 2, 2, 1, False)
    slow = ctx.slot_profile(1, 1, 1, 1, 2, 2, 1, False)
    (a, b), T = split_layers([fast, fast], 24, 8)
    worst = max(fast.time(*a, True, False), fast.time(*b, False, True))
    assert worst == pytest.approx(T, rel=1e-3)
    for cut in (a[1] - 1, a[1] + 1):  # moving the boundary never lowers the slowest stage
        assert max(fast.time(0, cut, True, False), fast.time(cut, 24, False, True)) >= worst * (1 - 1e-9)
    (a, b), _ = split_layers([fast, slow], 24, 8)
    assert a[1] - a[0] > b[1] - b[0]  # the A100 stage takes more blocks
    assert a == (0, a[1]) and b == (a[1], 24)


def test_split_balances_blocking_sends():
    ctx = ctx_for()
    fast = ctx.slot_profile(0, 1, 1, 1, 2, 3, 1, False)
    even, _ = split_layers([fast] * 3, 24, 8)
    assert split_layers([fast] * 3, 24, 8, sends=[0.0, 0.0, 0.0])[0] == even  # no sends: the plain split
    send = fast.time(0, 4, False, False)  # the middle stage sends for as long as four blocks compute
    split, T = split_layers([fast] * 3, 24, 8, sends=[0.0, send, 0.0])
    assert split[1][1] - split[1][0] < even[1][1] - even[1][0]  # the sending stage holds fewer blocks
    worst = max(fast.time(a, z, i == 0, i == 2) + (send if i == 1 else 0.0) for i, (a, z) in enumerate(split))
    plain = max(fast.time(a, z, i == 0, i == 2) + (send if i == 1 else 0.0) for i, (a, z) in enumerate(even))
    assert worst == pytest.approx(T, rel=1e-3) and worst < plain


@settings(max_examples=40, deadline=None)
@given(hst.lists(hst.floats(0.0, 2.0), min_size=2, max_size=8))
def test_send_split_is_contiguous_and_no_slower(shares):
    ctx = ctx_for()
    S, L = len(shares), ctx.model.num_layers
    prof = ctx.slot_profile(0, 1, 1, 1, 1, S, 1, False)
    unit = prof.time(0, 1, False, False)
    sends = [x * unit for x in shares]
    plain = split_layers([prof] * S, L, 8)
    r = split_layers([prof] * S, L, 8, sends=sends)
    assert (plain is None) == (r is None)
    if r is None:
        return
    split, _ = r
    assert split[0][0] == 0 and split[-1][1] == L and all(a < z for a, z in split)
    assert all(split[i][1] == split[i + 1][0] for i in range(S - 1))

    def slowest(sp):
        return max(prof.time(a, z, i == 0, i == S - 1) + sends[i] for i, (a, z) in enumerate(sp))

    assert slowest(split) <= slowest(plain[0]) * (1 + 1e-3)


def synthetic_profile(times, mem, cap, emb=0.3, head=0.5):
    from arachne.planners.arachne.context import SlotProfile

    zeros = np.zeros(len(times) + 1)
    return SlotProfile(np.concatenate([[0.0], np.cumsum(times)]), emb, head, 1.0,
                       np.concatenate([[0.0], np.cumsum(mem)]), zeros, 0.5, 0.0, 0.5, cap)


def bottleneck(profiles, split, extra):
    S = len(profiles)
    return max(p.time(a, z, i == 0, i == S - 1) + x for i, (p, (a, z), x) in enumerate(zip(profiles, split, extra)))


def fits(profiles, split):
    S = len(profiles)
    return all(p.memory(a, z, i == 0, i == S - 1, 1) <= p.capacity
               for i, (p, (a, z)) in enumerate(zip(profiles, split)))


def brute_force_split(profiles, L, extra):
    """The least bottleneck over every contiguous split that fits, by exhaustive search."""
    from itertools import combinations

    worst = [bottleneck(profiles, split, extra)
             for cuts in combinations(range(1, L), len(profiles) - 1)
             for split in [list(zip((0, *cuts), (*cuts, L)))] if fits(profiles, split)]
    return min(worst, default=None)


def random_split_problem(rnd, S, L, with_sends):
    """Stages of different speeds and memories over L equal layers (a dense model's blocks), with an
    embedding on the first and a head on the last; optionally blocking sends per stage."""
    profiles = [synthetic_profile([rnd.uniform(0.5, 3.0)] * L, [rnd.uniform(0.5, 1.5)] * L, rnd.uniform(2.5, 3.0 + L))
                for _ in range(S)]
    sends = [rnd.uniform(0.0, 2.0) for _ in range(S)] if with_sends and S > 1 else None
    return profiles, sends, sends or [0.0] * S


@settings(max_examples=60, deadline=None)
@given(hst.integers(1, 4), hst.integers(4, 10), hst.randoms(use_true_random=False), hst.booleans())
def test_split_finds_the_least_bottleneck(S, L, rnd, with_sends):
    # the bottleneck it reports is its split's, the exhaustive optimum (to 1e-4), and every stage fits;
    # plain bisection agrees. (With unequal layers the greedy fill is not exact: every stage must take one)
    profiles, sends, extra = random_split_problem(rnd, S, L, with_sends)
    r = split_layers(profiles, L, 1, sends=sends)
    slow = split_layers(profiles, L, 1, sends=sends, skip_ahead=False)
    best = brute_force_split(profiles, L, extra)
    assert (r is None) == (best is None) == (slow is None)
    if r is None:
        return
    split, T = r
    assert split[0][0] == 0 and split[-1][1] == L and all(split[i][1] == split[i + 1][0] for i in range(S - 1))
    assert bottleneck(profiles, split, extra) == pytest.approx(T, rel=1e-9) and T <= best * (1 + 1e-4)
    assert fits(profiles, split) and bottleneck(profiles, slow[0], extra) <= best * (1 + 1e-4)


def test_skipping_ahead_takes_fewer_fills_than_plain_bisection():
    rnd = random.Random(0)
    fast, plain = Work(), Work()
    for _ in range(300):
        S, L = rnd.randint(1, 16), rnd.randint(16, 96)
        profiles, sends, _ = random_split_problem(rnd, S, L, rnd.random() < 0.5)
        a = split_layers(profiles, L, 4, fast, sends=sends)
        b = split_layers(profiles, L, 4, plain, sends=sends, skip_ahead=False)
        assert (a is None) == (b is None)
        assert a is None or a[1] <= b[1] * (1 + 1e-9)  # never a slower bottleneck
    assert fast.fill_stages < 0.5 * plain.fill_stages


def test_send_balancing_speeds_up_pipelines_over_slow_links():
    # two nodes of two GPUs on a slow network: the middle boundary's sends occupy stages 1 and 2
    slow = cluster_from_dict({"name": "slow", "nodes": [
        {"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 2, "inter_node_gbps": 1.0}]})
    tpl = Template((Group(tuple(Slot(0, 1, 1) for _ in range(4)), 1),))
    times = []
    for balance in (False, True):
        ctx = ctx_for("GPT-3-1.3B", gbs=32, seq=2048, cluster=slow)
        ctx.balance_sends = balance
        plan, est = price_template(tpl, ctx)
        times.append(est.iteration_time_s)
    assert times[1] < 0.9 * times[0]
    sizes = [z - a for a, z in (s.layers for s in plan.pipelines[0].stages)]
    assert sizes[0] > sizes[1] and sizes[3] > sizes[2]  # the stages behind the slow link hold fewer blocks
    ctx = ctx_for("GPT-3-1.3B", gbs=32, seq=2048, cluster=slow)
    ctx.best_tok_s = 1e12  # far behind the best plan so far: not worth a second split
    assert price_template(tpl, ctx)[1].iteration_time_s == pytest.approx(times[0])



def test_a_middle_stage_is_charged_both_of_its_sends_as_the_cost_model_charges_them():
    """The send-balancing split charges each stage its activations forward and its gradients back, as the cost
    model's pipeline does (a middle stage sends over both its links, an end stage over one): charged only the
    slower link, the middle stages looked as cheap as the ends and the split piled blocks on them (fresh hold-out
    seed94/rob-029: GPT-OSS-120B on 18 MI300X nodes, Megatron's even 2-block stages 1.12x the split's 3 and 1)."""
    from arachne.planners.arachne.completion.place import placements
    from arachne.planners.arachne.completion.split import stage_sends

    slow = cluster_from_dict({"name": "slow", "nodes": [
        {"name": "a{i}", "count": 4, "gpu": "A100-40", "gpus_per_node": 1, "inter_node_gbps": 1.0}]})
    ctx = ctx_for("GPT-3-1.3B", gbs=32, seq=2048, cluster=slow)
    tpl = Template((Group(tuple(Slot(0, 1, 1) for _ in range(4)), 1),))
    group = placements(tpl, ctx)[0][0]
    sends = stage_sends(ctx, group, 2)
    nbytes = 2 * 2048 * ctx.model.hidden_size * 2
    link = [ctx.cost_model.network.p2p_time(list(group[0][i]), list(group[0][i + 1]), nbytes) for i in range(3)]
    assert sends == pytest.approx([link[0], link[0] + link[1], link[1] + link[2], link[2]])
    # with every stage alike, the first stage (one send, a light embedding) takes more blocks than the middle
    plan, _ = price_template(tpl, ctx)
    sizes = [z - a for a, z in (s.layers for s in plan.pipelines[0].stages)]
    assert sizes[0] > max(sizes[1], sizes[2])

def test_split_respects_memory():
    ctx = ctx_for("LLaMA-2-13B", gbs=32)
    prof = ctx.slot_profile(1, 1, 1, 1, 1, 2, 1, False)  # V100-16: a 13B model cannot fit on 2 GPUs
    assert split_layers([prof, prof], 40, 8) is None


def test_micro_batches_follow_pipeline_speed():
    counts = share_micro_batches([1.0, 2.0], [4.0, 8.0], 30)
    assert sum(counts) == 30 and counts[0] > counts[1]
    assert share_micro_batches([1.0], [3.0], 7) == [7]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(hst.lists(hst.tuples(hst.sampled_from([0.5, 1.0, 1.3, 2.0, 3.7]), hst.sampled_from([0.0, 1.0, 2.5, 9.0])),
                 min_size=1, max_size=40), hst.integers(1, 600))
def test_micro_batch_shares_sum_to_the_batch_and_finish_as_early_as_possible(pipes, total):
    import heapq

    periods, fills = [p for p, _ in pipes], [f for _, f in pipes]
    c = share_micro_batches(periods, fills, total)
    assert sum(c) == total and min(c) >= 0

    def finish(i: int, m: int) -> float:
        return (m - 1) * periods[i] + fills[i] if m > 0 else 0.0

    # one micro-batch at a time to the pipeline that would finish first: optimal for the slowest finish
    greedy, heap = [0] * len(pipes), [(fills[i], i) for i in range(len(pipes))]
    heapq.heapify(heap)
    for _ in range(total):
        _, i = heapq.heappop(heap)
        greedy[i] += 1
        heapq.heappush(heap, (finish(i, greedy[i] + 1), i))
    best = max(finish(i, m) for i, m in enumerate(greedy))
    assert max(finish(i, m) for i, m in enumerate(c)) <= best * (1 + 1e-9)



@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(hst.lists(hst.tuples(hst.sampled_from([0.5, 1.0, 1.3, 2.0, 3.7]), hst.sampled_from([0.0, 1.0, 2.5, 9.0]),
                            hst.sampled_from([1, 2, 4, 8])), min_size=1, max_size=5), hst.integers(1, 40))
def test_samples_shared_across_micro_batch_sizes_sum_to_the_batch_and_finish_near_the_best(pipes, k):
    periods, fills, sizes = (list(x) for x in zip(*pipes))
    total = k * min(sizes)
    c = share_samples(periods, fills, sizes, total)
    assert c is not None and min(c) >= 0
    assert sum(m * b for m, b in zip(c, sizes)) == total

    def exact_by(T: float) -> bool:
        """Whether micro-batches all finished by ``T`` can make up exactly ``total`` samples."""
        reach = {0}
        for p, f, b in zip(periods, fills, sizes):
            cap = int((T - f) / p + 1e-9) + 1 if T >= f - 1e-12 else 0
            reach = {r + j * b for r in reach for j in range(cap + 1) if r + j * b <= total}
        return total in reach

    ends = sorted({f + j * p for p, f, b in zip(periods, fills, sizes) for j in range(total // b + 1)})
    best = next(T for T in ends if exact_by(T))
    slowest = max((m - 1) * p + f for m, p, f in zip(c, periods, fills) if m > 0)
    assert slowest <= best * (1 + 1e-9)  # the best split
    if len(set(sizes)) == 1:  # one size: the same finish as sharing micro-batches
        same = share_micro_batches(periods, fills, total // sizes[0])
        assert slowest <= max((m - 1) * p + f for m, p, f in zip(same, periods, fills) if m > 0) + 1e-9


def test_samples_that_the_sizes_cannot_make_up_are_refused():
    assert share_samples([1.0, 1.0], [1.0, 1.0], [2, 4], 7) is None
    assert share_samples([1.0, 1.0], [1.0, 1.0], [2, 3], 8) is None  # sizes not multiples of the smallest
    assert share_samples([1.0, 2.0], [1.0, 2.0], [4, 2], 2) == [0, 1]


def test_a_group_of_fast_gpus_takes_a_larger_micro_batch_than_memory_lets_the_slow_ones():
    """Single-GPU replicas of OPT-350M on 16 A100 and 20 V100: the A100 pipelines run micro-batches of 2
    sequences and the V100 pipelines keep 1, where one size for all left the A100s at 1."""
    cl = cluster_from_dict({"name": "p", "nodes": [
        {"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8, "inter_node_gbps": 25},
        {"name": "v{i}", "count": 5, "gpu": "V100-16", "gpus_per_node": 4, "inter_node_gbps": 12.5}]})
    tpl = State(0, (Action("own", 1, 1, 1, 1, 16), Action("own", 1, 1, 1, 1, 20))).template()
    one = ctx_for("OPT-350M", gbs=144, seq=2048, cluster=cl)
    one.group_sizes = False
    plan1, est1 = price_template(tpl, one)
    assert {plan1.mbs(p) for p in plan1.pipelines} == {1}
    ctx = ctx_for("OPT-350M", gbs=144, seq=2048, cluster=cl)
    plan, est = price_template(tpl, ctx)
    validate_plan(plan, cl, ctx.model)
    sizes = {(ctx.cluster.devices[p.stages[0].devices[0]].gpu.name[:4], plan.mbs(p)) for p in plan.pipelines}
    assert sizes == {("A100", 2), ("V100", 1)}
    assert sum(p.micro_batches * plan.mbs(p) for p in plan.pipelines) == 144
    assert est.tokens_per_s > 1.05 * est1.tokens_per_s
    again = CostModel(cl).estimate(plan)  # the plan document prices the same from scratch
    assert again.iteration_time_s == pytest.approx(est.iteration_time_s)
    # a template priced well below the fastest plan so far is not worth the extra work
    behind = ctx_for("OPT-350M", gbs=144, seq=2048, cluster=cl)
    behind.best_tok_s = est.tokens_per_s / behind.group_within * 1.01
    plan2, _ = price_template(tpl, behind)
    assert {plan2.mbs(p) for p in plan2.pipelines} == {1}


def test_placement_keeps_tp_groups_inside_nodes():
    ctx = ctx_for()
    tpl = Template((Group((Slot(0, 2, 1), Slot(1, 2, 1)), 2),))
    placed = place(tpl, ctx)
    for reps in placed:
        for stages in reps:
            for devs in stages:
                assert len({d.split(":")[0] for d in devs}) == 1
    assert place(Template((Group((Slot(0, 4, 1),), 2),)), ctx) is None  # only 4 A100s


@pytest.mark.parametrize("mode", ["policy", "teacher", "floor", "random"])
def test_every_mode_returns_valid_fitting_plans(mode):
    cl = small_cluster()
    model = model_catalog().get("GPT-3-1.3B")
    plan, est, res = run_planner("arachne", cl, model, Job(global_batch_size=64, sequence_length=2048),
                                 budget=SearchBudget(time_budget_s=30), mode=mode)
    validate_plan(plan, cl, model)
    assert est.fits and est.tokens_per_s > 0
    assert plan.planner == "arachne" and plan.estimate["fits"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["OPT-350M", "GPT-3-1.3B"])
def test_exhaustive_oracle_bounds_arachne_and_arachne_is_close(model):
    cl = small_cluster()
    spec = model_catalog().get(model)
    job = Job(global_batch_size=64, sequence_length=2048)
    # the version-1 template space: both without the version-2 knobs
    _, ea, _ = run_planner("arachne", cl, spec, job, budget=SearchBudget(time_budget_s=30), modern_knobs=False)
    _, eo, _ = run_planner("exhaustive", cl, spec, job, budget=SearchBudget(time_budget_s=120), modern_knobs=False)
    assert eo.tokens_per_s >= ea.tokens_per_s * (1 - 1e-9) or ea.tokens_per_s / eo.tokens_per_s < 1.01
    assert ea.tokens_per_s >= 0.95 * eo.tokens_per_s
    # and with the knobs on both sides (the oracle gives them to more of its plans, with more estimates)
    _, ek, _ = run_planner("arachne", cl, spec, job, budget=SearchBudget(time_budget_s=30))
    _, eok, _ = run_planner("exhaustive", cl, spec, job, budget=SearchBudget(time_budget_s=120))
    assert eok.tokens_per_s >= eo.tokens_per_s * (1 - 1e-9)
    assert ek.tokens_per_s >= 0.95 * eok.tokens_per_s


def test_moe_plans_use_expert_parallelism():
    cl = cluster_from_dict({"nodes": [{"name": "h{i}", "count": 2, "gpu": "H100"}]})
    model = model_catalog().get("Mixtral-8x7B")
    plan, est, _ = run_planner("arachne", cl, model, Job(global_batch_size=64, sequence_length=2048),
                               budget=SearchBudget(time_budget_s=30))
    assert est.fits
    assert any(s.ep > 1 for p in plan.pipelines for s in p.stages)


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


def test_stage_order_placement_packs_replicas_of_a_stage_together():
    cl = cluster_from_dict({"name": "s", "nodes": [{"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 4}]})
    ctx = ctx_for(cluster=cl)
    tpl = Template((Group((Slot(0, 2, 1), Slot(0, 2, 1)), 2),))
    by_pipe = place(tpl, ctx)[0]
    by_stage = place(tpl, ctx, "stage")[0]
    node = lambda devs: devs[0].split(":")[0]  # noqa: E731
    assert node(by_pipe[0][0]) == node(by_pipe[0][1]) != node(by_pipe[1][0])  # a replica's stages share a node
    assert node(by_stage[0][0]) == node(by_stage[1][0]) != node(by_stage[0][1])  # a stage's replicas share one
    assert sorted(d for r in by_stage for s in r for d in s) == sorted(d for r in by_pipe for s in r for d in s)


def test_stage_order_wins_when_gradient_sync_dominates():
    """Many replicas of a large model on a slow network: the priced completion keeps the placement whose
    all-reduce stays inside nodes."""
    from arachne.planners.arachne.completion.place import placements
    from arachne.planners.arachne.completion.price import price_template

    cl = cluster_from_dict({"name": "s", "nodes": [{"name": "a{i}", "count": 4, "gpu": "A100-80", "gpus_per_node": 8,
                                                    "inter_node_gbps": 10}]})
    ctx = ctx_for("LLaMA-2-7B", gbs=64, seq=1024, cluster=cl)
    tpl = Template((Group(tuple(Slot(0, 2, 1) for _ in range(4)), 4),))
    assert len(placements(tpl, ctx)) == 2
    plan, est = price_template(tpl, ctx)
    for p in plan.pipelines[1:]:  # stage 0 of every replica sits on the first stage's node
        assert p.stages[0].devices[0].split(":")[0] == plan.pipelines[0].stages[0].devices[0].split(":")[0]


def test_teacher_labels_value_decisions_by_their_best_completion():
    from arachne.planners.arachne.train.teacher import _hindsight

    a, b = Action("mix", 1, 1, 1, 2, 2), Action("mix", 1, 1, 1, 3, 2)
    visited = {State(2, (a,)): 0.0, State(2, (a, b)): 5.0, State(2, (Action("skip"),)): 1.0}
    h = _hindsight(visited, 2)
    assert h[(2, (a,))] == 5.0  # the prefix alone does not fit, its completion does
    assert h[(2, (Action("skip"),))] == 1.0 and h[(2, (Action("skip"), Action("skip")))] == 1.0


def test_screening_is_a_cheaper_lower_bound_of_full_pricing():
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import floor_states

    ctx = ctx_for("LLaMA-2-7B", gbs=64)
    core, mixed = floor_states(ctx, Pricer(ctx), price=False)
    for st in core + mixed:
        screener, full = Pricer(ctx_for("LLaMA-2-7B", gbs=64)), Pricer(ctx_for("LLaMA-2-7B", gbs=64))
        cm_s, cm_f = screener.ctx.cost_model, full.ctx.cost_model
        v_s, v_f = screener.screen_state(st), full.price_state(st)
        assert v_s <= v_f * (1 + 1e-9)
        assert cm_s.estimates <= cm_f.estimates
        if v_f > 0:
            assert v_s > 0  # whatever fits in full also fits on the first look


def test_tiny_budget_still_returns_a_plan_and_infeasible_says_so():
    from arachne.errors import NoFeasiblePlanError

    cl = small_cluster()
    plan, est, _ = run_planner("arachne", cl, model_catalog().get("GPT-3-1.3B"),
                               Job(global_batch_size=64, sequence_length=2048), budget=SearchBudget(time_budget_s=0.01))
    validate_plan(plan, cl, model_catalog().get("GPT-3-1.3B"))  # raises on a broken plan
    assert est.fits
    with pytest.raises(NoFeasiblePlanError, match="no plan fits"):  # LLaMA-2-70B cannot fit in 8 GPUs of 16-40 GB
        run_planner("arachne", cl, model_catalog().get("LLaMA-2-70B"), Job(global_batch_size=64, sequence_length=2048),
                    budget=SearchBudget(time_budget_s=0.5))


def test_retraining_from_a_foreign_file_is_a_one_line_input_error(tmp_path):
    from arachne.errors import InputError
    from arachne.planners.arachne.train.pipeline import load_records

    bad = tmp_path / "data.npz"
    bad.write_text("name: not numpy\n")
    with pytest.raises(InputError, match="data.npz.*data: not a data.npz"):
        load_records(bad)


def five_type_cluster():
    """Five GPU types, fastest first, two node sizes: the shape of a large mixed inventory, scaled down."""
    return cluster_from_dict({"name": "five", "nodes": [
        {"name": "h{i}", "count": 4, "gpu": "H100", "gpus_per_node": 8},
        {"name": "a{i}", "count": 4, "gpu": "A100-80", "gpus_per_node": 8},
        {"name": "b{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8},
        {"name": "v{i}", "count": 4, "gpu": "V100-16", "gpus_per_node": 4},
        {"name": "t{i}", "count": 4, "gpu": "T4", "gpus_per_node": 4}]})


def test_graded_mixed_rule_widens_tp_on_slower_types_and_may_leave_slow_classes_out():
    from arachne.planners.arachne.search.rules import mixed_rule_state

    ctx = ctx_for("LLaMA-2-13B", gbs=256, seq=4096, cluster=five_type_cluster())
    names = [c.gpu.name for c in ctx.classes]
    assert names[:3] == ["H100-SXM5-80GB", "A100-SXM4-80GB", "A100-SXM4-40GB"]
    st = mixed_rule_state(ctx, 2, 2, j=3, graded=True)  # an A100 is 3.2x slower than an H100: tp 8 for tp 2
    assert [(a.kind, a.tp) for a in st.actions] == [("mix", 2), ("mix", 8), ("mix", 8)]
    assert [a.stages for a in st.actions] == [8, 2, 1]  # every GPU of the three classes, in 2 replicas
    plain = mixed_rule_state(ctx, 2, 2)
    assert len(plain.actions) == 5 and {a.tp for a in plain.actions if a.kind == "mix"} == {2}
    assert mixed_rule_state(ctx, 2, 2, j=1) is None  # one class is not a mix


@pytest.mark.parametrize("model", ["LLaMA-2-13B", "Mixtral-8x7B"])
def test_mixed_rules_are_valid_distinct_and_keep_the_plain_rule_early(model):
    from arachne.planners.arachne.actions import mix_replica_options
    from arachne.planners.arachne.search.rules import (
        may_fit,
        mixed_floor_states,
        mixed_rule_state,
    )

    ctx = ctx_for(model, gbs=256, seq=4096, cluster=five_type_cluster())
    states = mixed_floor_states(ctx)
    templates = [st.template() for st in states]
    assert len(set(templates)) == len(templates)
    spare = sum(c.gpu.memory_bytes * c.count for c in ctx.classes)
    for st in states:
        assert st.template().fits_counts(ctx.classes)
        assert 0 < st.mixed_stages() <= ctx.model.num_layers
        assert may_fit(ctx, st, spare)
    graded = [st for st in states if len({a.tp for a in st.actions if a.kind == "mix"}) > 1]
    assert graded and any(len(st.actions) < len(ctx.classes) for st in states)
    # the one-tp-level rule over every class (with the most replicas) stays among the first two
    first = next(st for R in sorted(mix_replica_options(ctx.classes), reverse=True) if R
                 if (st := mixed_rule_state(ctx, R, 1)) is not None)
    assert first.template() in templates[:2]


def test_a_graded_rule_over_the_classes_whose_nodes_hold_their_grade():
    """A slow type in one-GPU nodes cannot hold the tp its speed asks (RTX 4090: 8 against an H800); a graded rule
    over every class gives it many one-block stages. The graded rule over the classes whose nodes hold their grade
    leaves it out and runs the wide V100 node at tp 8, the fastest rule (Sailor's pipeline on seed109/rob-016)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import mixed_floor_states

    cl = cluster_from_dict({"name": "g", "nodes": [
        {"name": "h{i}", "count": 1, "gpu": "H800", "gpus_per_node": 8},
        {"name": "l{i}", "count": 4, "gpu": "L40S", "gpus_per_node": 2},
        {"name": "r{i}", "count": 14, "gpu": "RTX-4090", "gpus_per_node": 1},
        {"name": "v{i}", "count": 1, "gpu": "V100-32", "gpus_per_node": 8}]})
    ctx = ctx_for("DeepSeek-MoE-16B", gbs=16, seq=3072, cluster=cl)
    assert [c.gpu.name for c in ctx.classes] == ["H800-SXM5-80GB", "L40S", "RTX-4090", "V100-SXM2-32GB"]
    pricer = Pricer(ctx)
    rules = mixed_floor_states(ctx)
    best = max(rules, key=lambda st: pricer.throughput(st.template()))
    assert [(a.kind, a.tp) for a in best.actions] == [("mix", 1), ("mix", 2), ("skip", 1), ("mix", 8)]
    with_rtx = max(pricer.throughput(st.template()) for st in rules
                   if len(st.actions) > 2 and st.actions[2].kind == "mix")
    assert pricer.throughput(best.template()) > 1.05 * with_rtx


def test_mix_proxy_prefers_leaving_a_class_on_a_crawling_network_out():
    from arachne.planners.arachne.search.rules import _mix_proxy, mixed_rule_state

    cl = cluster_from_dict({"name": "slow", "nodes": [
        {"name": "h{i}", "count": 4, "gpu": "H100", "gpus_per_node": 8},
        {"name": "t{i}", "count": 4, "gpu": "T4", "gpus_per_node": 8, "inter_node_gbps": 1}]})
    ctx = ctx_for("LLaMA-2-7B", gbs=256, seq=4096, cluster=cl)
    both = mixed_rule_state(ctx, 4, 1)
    assert both is not None and all(a.kind == "mix" for a in both.actions)
    fast_only = State(4, (both.actions[0], Action("skip")))
    assert _mix_proxy(ctx, fast_only) > _mix_proxy(ctx, both) > 0


def test_moe_mixed_rule_spreads_stages_over_the_node_with_experts_sharded():
    from arachne.planners.arachne.search.rules import (
        mixed_floor_states,
        mixed_rule_state,
    )

    ctx = ctx_for("Mixtral-8x7B", gbs=256, seq=4096, cluster=five_type_cluster())
    st = mixed_rule_state(ctx, 2, 1, j=2, experts=True)
    assert [(a.tp, a.dp, a.ep) for a in st.actions] == [(1, 8, 8), (1, 8, 8)]  # 8 experts over 8-GPU nodes
    assert all(a.stages * a.dp * a.tp * 2 <= c.count for a, c in zip(st.actions, ctx.classes))
    assert any(a.ep > 1 for s in mixed_floor_states(ctx) for a in s.actions if a.kind == "mix")
    dense = ctx_for("LLaMA-2-13B", gbs=256, seq=4096, cluster=five_type_cluster())
    assert all(a.dp == 1 for s in mixed_floor_states(dense) for a in s.actions)


@pytest.mark.slow
def test_a_longer_target_extends_the_default_pass_and_never_loses():
    """Beyond the default target the planner runs the default pass first, then keeps improving on it."""
    cl = cluster_from_dict({"name": "m", "nodes": [
        {"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8},
        {"name": "a{i}", "count": 3, "gpu": "A100-40", "gpus_per_node": 8},
        {"name": "t{i}", "count": 8, "gpu": "T4", "gpus_per_node": 4}]})
    m, job = model_catalog().get("LLaMA-2-13B"), Job(global_batch_size=256, sequence_length=2048)
    _, short, r1 = run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=10), target_s=0.8)
    plan, long_, r2 = run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=10), target_s=2.0)
    assert "extended_s" not in r1.stats.notes and "extended_s" in r2.stats.notes
    assert long_.tokens_per_s >= short.tokens_per_s * (1 - 1e-9)
    validate_plan(plan, cl)
    assert long_.fits



@pytest.mark.slow
def test_a_longer_target_keeps_the_default_pass_on_odd_nodes():
    """On nodes of 6 and 7 GPUs the planner splits its target between a quick pass over the nodes' parts and the
    search over whole nodes; a longer target splits its default pass the same way and gives the extra time to
    the whole-node search (it used to re-split it: a slower plan here, 8% slower on odd108-rerun/rob-022)."""
    cl = cluster_from_dict({"name": "odd", "nodes": [
        {"name": "h{i}", "count": 1, "gpu": "H100", "gpus_per_node": 8},
        {"name": "a{i}", "count": 1, "gpu": "A100-80", "gpus_per_node": 8},
        {"name": "t{i}", "count": 1, "gpu": "Titan-RTX", "gpus_per_node": 8},
        {"name": "r6-{i}", "count": 1, "gpu": "RTX-2080-Ti", "gpus_per_node": 6},
        {"name": "r7-{i}", "count": 1, "gpu": "RTX-2080-Ti", "gpus_per_node": 7},
        {"name": "m{i}", "count": 3, "gpu": "MI250X", "gpus_per_node": 1},
        {"name": "s{i}", "count": 2, "gpu": "Titan-RTX", "gpus_per_node": 1}]})
    m, job = model_catalog().get("Qwen2-57B-A14B"), Job(global_batch_size=512, sequence_length=1024)
    est = {t: run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=30),
                          legality=Legality.of("arachne"), target_s=t)[1] for t in (0.8, 1.2)}
    assert est[1.2].tokens_per_s >= est[0.8].tokens_per_s * (1 - 1e-9)

def test_replica_variants_keep_one_nodes_worth():
    from arachne.planners.arachne.actions import replica_variants

    ctx = ctx_for(cluster=cluster_from_dict({"name": "b", "nodes": [
        {"name": "b{i}", "count": 4, "gpu": "B200", "gpus_per_node": 8, "inter_node_gbps": 1.25}]}))
    c = ctx.classes[0]
    assert replica_variants(Action("own", 1, 1, 1, 2, 16), c) == [Action("own", 1, 1, 1, 2, 4)]
    assert replica_variants(Action("own", 4, 1, 1, 4, 2), c) == [Action("own", 4, 1, 1, 4, 1)]  # spans nodes
    assert replica_variants(Action("own", 1, 1, 1, 8, 1), c) == []
    assert replica_variants(Action("mix", 1, 1, 1, 2, 4), c) == []


@pytest.mark.slow
def test_on_a_crawling_inter_node_network_the_job_stays_in_one_node():
    """Data parallelism over 10 Gb/s links loses to one node's worth of GPUs: arachne must see that (a pipeline
    may still cross the link: its stages send only activations)."""
    cl = cluster_from_dict({"name": "slow", "nodes": [
        {"name": "b{i}", "count": 4, "gpu": "B200", "gpus_per_node": 8, "inter_node_gbps": 1.25}]})
    m, job = model_catalog().get("Qwen2-57B-A14B"), Job(global_batch_size=256, sequence_length=1024)
    ctx = PlanningContext(cl, m, job, CostModel(cl))
    from arachne.planners.arachne.search.pricer import Pricer

    in_node = Pricer(ctx).price_state(State(0, (Action("own", 4, 1, 1, 2, 1),)))
    # a 2 s target: the default pass, then more; keeps a slow CI machine from deciding the outcome
    plan, est, _ = run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=10), target_s=2.0)
    assert in_node > 0 and est.tokens_per_s >= 0.99 * in_node
    assert all(len({d.split(":")[0] for d in s.devices}) == 1 for p in plan.pipelines for s in p.stages)
    assert len(plan.pipelines) == 1  # no replica across the link either


def test_replica_variants_share_the_batch_evenly():
    from arachne.planners.arachne.actions import replica_variants

    ctx = ctx_for(cluster=cluster_from_dict({"name": "b", "nodes": [
        {"name": "b{i}", "count": 34, "gpu": "B200", "gpus_per_node": 2}]}))
    c = ctx.classes[0]
    assert Action("own", 1, 1, 1, 4, 16) in replica_variants(Action("own", 1, 1, 1, 4, 17), c, 384)
    assert replica_variants(Action("own", 1, 1, 1, 4, 16), c, 384) == [Action("own", 1, 1, 1, 4, 1)]


@pytest.mark.slow
def test_deeper_homogeneous_pipelines_with_an_even_batch_share_are_tried():
    """A small model on many GPUs: 16 replicas of 4 stages on the B200 pairs beat 68 (or 17) replicas
    that sync more gradients or share the batch unevenly; the rules must put that template forward."""
    cl = cluster_from_dict({"name": "b", "nodes": [
        {"name": "l{i}", "count": 56, "gpu": "L4", "gpus_per_node": 1},
        {"name": "p{i}", "count": 34, "gpu": "B200", "gpus_per_node": 2, "inter_node_gbps": 25},
        {"name": "e{i}", "count": 8, "gpu": "B200", "gpus_per_node": 8, "inter_node_gbps": 3.125}]})
    m, job = model_catalog().get("OPT-350M"), Job(global_batch_size=384, sequence_length=512)
    from arachne.planners.arachne.search.pricer import Pricer

    ctx = PlanningContext(cl, m, job, CostModel(cl))
    pairs = next(c.index for c in ctx.classes if c.node_size == 2)
    st = State(0, tuple(Action("skip") for _ in range(pairs)) + (Action("own", 1, 1, 1, 4, 16),))
    target = Pricer(ctx).price_state(st)
    _, est, _ = run_planner("arachne", cl, m, job, CostModel(cl), SearchBudget(time_budget_s=10), target_s=2.0)
    assert target > 0 and est.tokens_per_s >= 0.99 * target


def test_replica_moves_reach_the_nearest_even_batch_shares():
    from arachne.planners.arachne.search.refine import replica_moves

    cl = cluster_from_dict({"name": "r", "nodes": [{"name": "a{i}", "count": 5, "gpu": "A100-80", "gpus_per_node": 8},
                                                   {"name": "v{i}", "count": 3, "gpu": "V100-32", "gpus_per_node": 8}]})
    ctx = ctx_for("GPT-3-6.7B", gbs=1000, cluster=cl)
    st = State(8, (Action("mix", 1, 1, 1, 5, 8), Action("mix", 1, 1, 1, 3, 8)))
    moves = {m.mix_replicas: [a.stages for a in m.actions] for m in replica_moves(ctx, st)}
    # 1000 sequences: 10 and 5 replicas share them evenly (the grid has 6, 8 and 12); stages rescale
    # to each class's 40 and 24 GPUs
    assert moves == {10: [4, 2], 5: [8, 4]}
    assert all(a.replicas == r for r in moves for m in replica_moves(ctx, st) if m.mix_replicas == r
               for a in m.actions)
    assert replica_moves(ctx, State(0, (Action("own", 1, 1, 1, 5, 8), Action("skip")))) == []


def test_adjacent_stage_counts_fill_the_grid_gaps():
    from arachne.planners.arachne.search.refine import adjacent_stages

    cl = cluster_from_dict({"name": "a", "nodes": [{"name": "a{i}", "count": 7, "gpu": "A100-80", "gpus_per_node": 8}]})
    ctx = ctx_for("LLaMA-2-70B", gbs=16, cluster=cl)
    c, prefix = ctx.classes[0], State(0)
    options = class_actions(prefix, ctx.model, c)
    # 56 GPUs at tp 8: one 7-stage pipeline, between the grid's 6 and 8
    assert adjacent_stages(Action("own", 8, 1, 1, 6, 1), options, prefix, c, ctx.model.num_layers) == [
        Action("own", 8, 1, 1, 7, 1)]
    assert adjacent_stages(Action("own", 1, 1, 1, 4, 14), options, prefix, c, 80) == []  # 3 and 5: on the grid


def test_balanced_stage_moves_find_the_counts_that_split_evenly():
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.refine import balanced_stage_moves

    # 40 blocks plus the embedding and head: 14 stages of 3 "layers" each; the grid's 12 and 16 are
    # uneven, and 14 stages of 32 H100 replicas price faster than 16 stages of 28
    cl = cluster_from_dict({"name": "h", "nodes": [{"name": "h{i}", "count": 112, "gpu": "H100-PCIe",
                                                   "gpus_per_node": 4}]})
    ctx = ctx_for("GPT-3-13B", gbs=1000, seq=2048, cluster=cl)
    start = State(0, (Action("own", 1, 1, 1, 16, 28),))
    moves = balanced_stage_moves(ctx, start)
    most = [m for m in moves if m.actions[0].replicas == 448 // m.actions[0].stages]
    counts = [m.actions[0].stages for m in most]
    assert 14 in counts and 16 not in counts and all(8 <= S <= 32 for S in counts)
    # the rest: the same counts (and the start's 16) at the most replicas sharing the batch evenly (25, 20)
    even = [(m.actions[0].stages, m.actions[0].replicas) for m in moves if m not in most]
    assert (16, 25) in even and all(1000 % r == 0 and S in counts + [16] for S, r in even)
    pricer = Pricer(ctx)
    best = max(pricer.throughput(m.template()) for m in moves)
    assert best > 1.03 * pricer.throughput(start.template())
    assert balanced_stage_moves(ctx, State(2, (Action("mix", 1, 1, 1, 8, 2),))) == []


def test_further_refinement_starts_are_the_next_best_distinct_templates():
    from arachne.planners.arachne.planner import _next_starts
    from arachne.planners.arachne.search.pricer import Pricer

    pricer = Pricer(ctx_for())
    a = [State(0, (Action("own", 1, 1, 1, S, 1), Action("skip"))) for S in (1, 2, 4, 8)]
    padded = State(0, (Action("own", 1, 1, 1, 2, 1),))  # the same template as a[1]
    pricer.visited.update({a[0]: 5.0, a[1]: 4.0, padded: 4.5, a[2]: 3.0, a[3]: 0.0})
    assert _next_starts(pricer, {a[0].template()}, 2) == [padded, a[2]]
    assert _next_starts(pricer, {a[0].template(), a[1].template()}, 3) == [a[2]]  # unpriced ones never


def test_neighbours_end_with_the_same_gpus_split_another_way_between_tp_and_dp():
    from arachne.planners.arachne.search.refine import _neighbours

    cur = Action("own", 2, 2, 1, 8, 3)
    options = [Action("own", 4, 1, 1, 8, 3), Action("own", 2, 2, 1, 4, 6), Action("own", 4, 2, 1, 8, 1),
               Action("own", 1, 4, 1, 8, 3), Action("own", 4, 1, 1, 4, 6), Action("skip"), cur]
    assert _neighbours(cur, options) == [Action("own", 2, 2, 1, 4, 6), Action("own", 4, 2, 1, 8, 1), Action("skip"),
                                         Action("own", 4, 1, 1, 8, 3), Action("own", 1, 4, 1, 8, 3)]


def test_an_unreachable_ray_address_is_a_one_line_input_error():
    from arachne.errors import InputError
    from arachne.planners.arachne.train.pipeline import check_reachable

    with pytest.raises(InputError, match="--address"):
        check_reachable("127.0.0.1:1", timeout_s=1)
    with pytest.raises(InputError, match="--address"):
        check_reachable("ray://nohost", timeout_s=1)


def test_depth_actions_find_the_depth_between_all_reduce_and_bubbles():
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import depth_actions, rule_own_actions

    # a batch of 128 on 468 T4s behind 25 Gb/s: the fewest stages that fit all-reduce every weight over
    # ~117 replicas, the deepest leave most GPUs in bubbles; between them a tp 4 pipeline of 5-12 stages
    cl = cluster_from_dict({"name": "t", "nodes": [{"name": "t{i}", "count": 117, "gpu": "T4", "gpus_per_node": 4,
                                                   "inter_node_gbps": 25}]})
    ctx = ctx_for("LLaMA-3-8B", gbs=128, seq=2048, cluster=cl)
    acts = depth_actions(ctx, 0)
    assert len(acts) == 2 and all(a.tp == 4 and 5 <= a.stages <= 12 for a in acts)
    assert all(a.replicas == 468 // (4 * a.stages) for a in acts)
    pricer = Pricer(ctx)
    best = max(pricer.throughput(State(0, (a,)).template()) for a in acts)
    rules = max(pricer.throughput(State(0, (a,)).template()) for a in rule_own_actions(ctx, 0))
    assert best > 1.2 * rules


def test_offgrid_regroupings_split_an_offgrid_stage_count_another_way():
    from arachne.planners.arachne.search.refine import offgrid_regroupings

    cl = cluster_from_dict({"name": "t", "nodes": [{"name": "t{i}", "count": 117, "gpu": "T4", "gpus_per_node": 4}]})
    ctx = ctx_for("LLaMA-3-8B", gbs=128, seq=2048, cluster=cl)
    c, prefix = ctx.classes[0], State(0)
    options = class_actions(prefix, ctx.model, c)
    moved = offgrid_regroupings(Action("own", 2, 2, 1, 19, 6), options, ctx.model, c)
    assert moved == [Action("own", 1, 4, 1, 19, 6), Action("own", 4, 1, 1, 19, 6)]
    assert offgrid_regroupings(Action("own", 2, 2, 1, 20, 5), options, ctx.model, c) == []  # on the grid


def split_type_cluster():
    """14 A100s split between two 4-GPU nodes and six single-GPU nodes, beside 16 single T4s."""
    return cluster_from_dict({"name": "k", "nodes": [
        {"name": "a{i}", "count": 2, "gpu": "A100-80", "gpus_per_node": 4},
        {"name": "b{i}", "count": 6, "gpu": "A100-80", "gpus_per_node": 1},
        {"name": "t{i}", "count": 16, "gpu": "T4", "gpus_per_node": 1}]})


def test_a_mixed_slot_pools_the_node_sizes_of_its_gpu_type():
    from arachne.planners.arachne.actions import kin_left, mix_replica_options

    ctx = ctx_for("OPT-350M", gbs=1024, seq=1024, cluster=split_type_cluster())
    a4, a1, t4 = ctx.classes
    assert a4.kin == a1.kin == ((0, 8, 4), (1, 6, 1)) and t4.kin == ((2, 16, 1),)
    assert 12 in mix_replica_options(ctx.classes)  # 14 A100s and 16 T4s can carry 12 replicas
    st = State(14)
    pooled = [a for a in class_actions(st, ctx.model, a4) if a.kind == "mix"]
    assert Action("mix", 1, 1, 1, 1, 14, pool=True) in pooled and all(a.pool for a in pooled)
    assert all(a.tp == 1 for a in pooled)  # single-GPU kin nodes take no tp 2 slots
    st = st.push(Action("mix", 1, 1, 1, 1, 14, pool=True))
    assert kin_left(st, a1) == {0: 0, 1: 0}
    assert class_actions(st, ctx.model, a1) == [Action("skip")]
    st = st.push(Action("skip")).push(Action("mix", 1, 1, 1, 1, 14))
    tpl = st.template()
    assert tpl.fits_counts(ctx.classes)
    devs = [d for rep in place(tpl, ctx)[0] for d in rep[0]]
    assert len(set(devs)) == 14 and sum(d.startswith("a") for d in devs) == 8
    assert price_template(tpl, ctx) is not None
    # without the pool the same slot does not fit; nor does a pooled one larger than the type
    assert not Template((Group((Slot(0, 1, 1, 1), Slot(2, 1, 1, 1)), 14),)).fits_counts(ctx.classes)
    assert not Template((Group((Slot(0, 1, 1, 1, True), Slot(2, 1, 1, 1)), 15),)).fits_counts(ctx.classes)


def test_replica_moves_reach_the_count_a_pooled_class_fills():
    from arachne.planners.arachne.search.refine import replica_moves

    ctx = ctx_for("OPT-350M", gbs=1024, seq=1024, cluster=split_type_cluster())
    st = State(12, (Action("mix", 1, 1, 1, 1, 12, pool=True), Action("own", 1, 1, 1, 2, 1),
                    Action("mix", 1, 1, 1, 1, 12)))
    assert [m.mix_replicas for m in replica_moves(ctx, st)] == [16, 8]  # a batch of 1024 shares evenly
    moves = {m.mix_replicas: m for m in replica_moves(ctx, st) + replica_moves(ctx, st, fill=True)}
    assert [m.mix_replicas for m in replica_moves(ctx, st, fill=True)] == [14]
    m = moves[14]
    assert m.actions == (Action("mix", 1, 1, 1, 1, 14, pool=True), Action("skip"), Action("mix", 1, 1, 1, 1, 14))
    assert m.template().fits_counts(ctx.classes)
    assert moves[8].actions[0] == Action("mix", 1, 1, 1, 1, 8)  # 8 replicas need no pool


@pytest.mark.slow
def test_mixed_rules_pool_a_split_gpu_type_and_try_the_count_it_fills():
    from arachne.planners.arachne.actions import type_fills
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import mixed_floor_states

    ctx = ctx_for("OPT-350M", gbs=1024, seq=1024, cluster=split_type_cluster())
    assert type_fills(ctx.classes) == [14]
    rules = mixed_floor_states(ctx)
    pricer = Pricer(ctx)
    best = max(rules, key=lambda st: pricer.throughput(st.template()))
    # 14 replicas of [A100 | T4]: the A100 stage from both node sizes; every unpooled rule is slower
    assert best.mix_replicas == 14 and best.actions[0].pool and best.actions[1].kind == "skip"
    unpooled = max(pricer.throughput(st.template()) for st in rules if not any(a.pool for a in st.actions))
    assert pricer.throughput(best.template()) > 1.05 * unpooled


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


def test_micro_batch_candidates_reach_32_sequences_per_gpu_of_the_widest_stage():
    from arachne.planners.arachne.completion.batch import mbs_candidates

    job = Job(global_batch_size=128, sequence_length=1024)
    plain = Template((Group((Slot(0, 1, 1),), 8),))
    wide = Template((Group((Slot(0, 1, 8, 4),), 1),))  # one stage over 8 GPUs (experts sharded 4 ways)
    assert mbs_candidates(plain, job, True) == [1, 2, 4, 8, 16, 32]
    assert mbs_candidates(wide, job, True) == [8, 16, 32, 64, 128]
    # off the powers of two: the whole batch in one or two micro-batches of the one pipeline
    assert mbs_candidates(wide, Job(global_batch_size=96, sequence_length=1024), True) == [8, 16, 32, 48, 96]
    # 16 data-parallel replicas of a batch of 384: one micro-batch of 24 each, or two of 12 (AMP's plan on
    # odd100/rob-025, 1.7% faster than micro-batches of 8)
    sixteen = Template((Group((Slot(0, 1, 1),), 16),))
    assert mbs_candidates(sixteen, Job(global_batch_size=384, sequence_length=1024), True) == [1, 2, 4, 8, 16, 32,
                                                                                                12, 24]
    # a lock-step stage of 200 replicas (a batch of 1,000 on 200 of 465 A100, fresh hold-out seed82/rob-015): no
    # power of two is a multiple of 200; its own multiples, 1 or 5 sequences per replica, are the candidates
    lock = Template((Group((Slot(0, 1, 200, 20),), 1),))
    assert mbs_candidates(lock, Job(global_batch_size=1000, sequence_length=512)) == [200, 1000]
    # a lock-step stage of 256 replicas (a batch of 1,024 on 256 of 480 A100, fresh hold-out seed90/rob-023):
    # 2 and 4 sequences per replica too (Megatron's plan runs 4), not only 1 (the sizes stopped at 32 x 8)
    wide256 = Template((Group((Slot(0, 1, 256, 4),), 1),))
    assert mbs_candidates(wide256, Job(global_batch_size=1024, sequence_length=1024)) == [256, 512, 1024]


def test_wide_rules_leave_out_the_classes_whose_nodes_are_too_narrow():
    """A small batch wants deep tp-8 stages: the rule over only the 8-GPU-node classes (V100 and T4 here,
    without the faster A100s in 4-GPU nodes) exists, and no fastest-j rule builds it."""
    from arachne.planners.arachne.search.rules import (
        mixed_floor_states,
        mixed_rule_state,
    )

    cl = cluster_from_dict({"name": "w", "nodes": [
        {"name": "a{i}", "count": 2, "gpu": "A100-80", "gpus_per_node": 4},
        {"name": "v{i}", "count": 3, "gpu": "V100-32", "gpus_per_node": 8},
        {"name": "t{i}", "count": 2, "gpu": "T4", "gpus_per_node": 8}]})
    ctx = ctx_for("LLaMA-2-7B", gbs=32, cluster=cl)
    assert [c.node_size for c in ctx.classes] == [4, 8, 8]

    def wide_tp8(st):
        if len(st.actions) != 3:
            return False
        a, v, t = st.actions
        return a.kind == "skip" and (v.kind, v.tp, t.kind, t.tp) == ("mix", 8, "mix", 8)

    st = mixed_rule_state(ctx, 1, 8, wide=True)
    assert st is not None and wide_tp8(st) and st.mixed_stages() == 5
    assert any(wide_tp8(s) for s in mixed_floor_states(ctx))
    assert not any(wide_tp8(s) for j in (2, 3) for tp in (1, 2, 4, 8) for g in (False, True)
                   if (s := mixed_rule_state(ctx, 1, tp, j, g)) is not None)


def test_tail_stages_hang_a_slow_node_off_a_fast_pipeline():
    """Refinement from a homogeneous pipeline of 8 one-GPU H800 stages can add a whole V100 node as one
    more stage (tp x dp inside the node): no dense rule builds a mixed slot with stage-level dp, and on
    this job the tail stage beats the H800 pipeline alone (Metis's plan on seed14/rob-022)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.refine import refine, tail_stages
    from arachne.planners.protocol import Deadline

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "h", "gpu": "H800", "inter_node_gbps": 100, "intra_node_gbps": 32},
        {"name": "v", "gpu": "V100-16", "inter_node_gbps": 12.5},
        {"name": "a{i}", "count": 2, "gpu": "A10", "gpus_per_node": 1}]})
    ctx = ctx_for("OPT-350", gbs=64, seq=512, cluster=cl)
    assert [c.gpu.name for c in ctx.classes] == ["H800-SXM5-80GB", "A10", "V100-SXM2-16GB"]
    own = State(0, (Action("own", 1, 1, 1, 8, 1), Action("skip"), Action("skip")))
    tails = tail_stages(ctx, own)
    assert [(a.kind, a.tp, a.dp, a.stages, a.replicas) for a in tails[-1].actions] == [
        ("mix", 1, 1, 8, 1), ("skip", 1, 1, 0, 0), ("mix", 2, 4, 1, 1)]
    assert len(tails) == 2 and all(t.mix_replicas == 1 for t in tails)
    assert tail_stages(ctx, tails[-1]) == []  # only from states without a mixed group
    pricer = Pricer(ctx)
    end = refine(ctx, pricer, own, Deadline(60))
    assert end.mix_replicas == 1 and end.actions[2].kind == "mix" and end.actions[2].dp > 1
    assert pricer.throughput(end.template()) > 1.02 * pricer.throughput(own.template())


def test_mixed_rules_also_leave_out_classes_on_a_much_slower_network():
    """GH200 nodes of 4 on 3 Gb/s come first in speed order, so every fastest-j rule mixes them in; the
    rule without them mixes the GH200 nodes of 2 (92 Gb/s) with the L40S nodes (seed17/rob-009)."""
    from arachne.planners.arachne.search.rules import (
        mixed_floor_states,
        mixed_rule_state,
        slow_network_classes,
    )

    cl = cluster_from_dict({"name": "n", "nodes": [
        {"name": "g4-{i}", "count": 4, "gpu": "GH200", "gpus_per_node": 4, "inter_node_gbps": 3.125},
        {"name": "g2-{i}", "count": 8, "gpu": "GH200", "gpus_per_node": 2, "inter_node_gbps": 92.5},
        {"name": "l-{i}", "count": 16, "gpu": "L40S", "gpus_per_node": 2, "inter_node_gbps": 25}]})
    ctx = ctx_for("LLaMA-2-7B", gbs=256, cluster=cl)
    assert [(c.gpu.name, c.node_size) for c in ctx.classes] == [("GH200-96GB", 4), ("GH200-96GB", 2), ("L40S", 2)]
    assert slow_network_classes(ctx.classes) == {0}

    def without_slow(st):
        return len(st.actions) == 3 and st.actions[0].kind == "skip" and all(
            a.kind == "mix" for a in st.actions[1:])

    assert any(without_slow(s) for s in mixed_floor_states(ctx))
    assert not any(without_slow(s) for R in (1, 2, 4, 8, 16) for tp in (1, 2) for j in (2, 3) for g in (False, True)
                   if (s := mixed_rule_state(ctx, R, tp, j, g)) is not None)


def test_offgrid_regroupings_keep_the_nearest_expert_parallelism():
    """A tp 2 x dp 4 x ep 4 MoE stage off the stage-count grid can become tp 4 x dp 2, whose dp allows
    ep 2 at most (Megatron's 14 stages of tp 4 x dp 2 on seed16/rob-012)."""
    from arachne.planners.arachne.actions import class_actions
    from arachne.planners.arachne.search.refine import offgrid_regroupings

    cl = cluster_from_dict({"name": "m", "nodes": [{"name": "m{i}", "count": 15, "gpu": "MI300X"}]})
    ctx = ctx_for("Mixtral-8x22B", gbs=512, seq=4096, cluster=cl)
    cur = Action("own", 2, 4, 4, 14, 1)
    options = class_actions(State(0), ctx.model, ctx.classes[0])
    moves = offgrid_regroupings(cur, options, ctx.model, ctx.classes[0])
    assert Action("own", 4, 2, 2, 14, 1) in moves and all(a.tp * a.dp == 8 and a.ep <= a.dp for a in moves)


def test_refinement_regroups_a_wide_tp_group_before_trying_unused_classes():
    """With time for a few prices only, refinement still turns 10 replicas of one tp-8 stage into tp 4 x dp 2
    (Megatron's plan on seed16/rob-008): the unused L40S and A100-80 classes ahead of it in speed order have
    dozens of options each."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.refine import refine
    from arachne.planners.protocol import Deadline

    cl = cluster_from_dict({"name": "r", "nodes": [
        {"name": "l{i}", "count": 24, "gpu": "L40S", "gpus_per_node": 1, "inter_node_gbps": 50},
        {"name": "a{i}", "count": 12, "gpu": "A100-80", "gpus_per_node": 1},
        {"name": "b{i}", "count": 10, "gpu": "A100-40"}]})
    ctx = ctx_for("LLaMA-3-8B", gbs=16, seq=4096, cluster=cl)
    assert [c.gpu.name for c in ctx.classes] == ["L40S", "A100-SXM4-80GB", "A100-SXM4-40GB"]
    start = State(0, (Action("skip"), Action("skip"), Action("own", 8, 1, 1, 1, 10)))
    pricer = Pricer(ctx)
    v0 = pricer.throughput(start.template())
    end = refine(ctx, pricer, start, Deadline(4, clock=lambda: len(pricer.cache)))
    assert len(pricer.cache) <= 6
    assert end.actions[2].tp == 4 and end.actions[2].dp == 2
    assert pricer.throughput(end.template()) > 1.05 * v0


def test_completion_builds_equal_stages_once_and_they_validate():
    """Candidates at other micro-batch sizes share their stages; a shared stage equals a validated one."""
    from arachne.plan import Stage

    ctx = ctx_for()
    a = ctx.stage((0, 4), ("n0/0", "n0/1"), 2, 1, 1, False)
    assert ctx.stage((0, 4), ("n0/0", "n0/1"), 2, 1, 1, False) is a
    assert ctx.stage((0, 4), ("n0/0", "n0/1"), 2, 1, 1, True) is not a
    assert a == Stage(layers=(0, 4), devices=("n0/0", "n0/1"), tp=2, ep=1)


def test_deep_tail_when_too_few_slow_nodes_for_every_replica():
    """With two V100 nodes for four GH200 pipelines, every GH200 becomes one stage of a single pipeline
    and one V100 node (tp 8) its first stage: a small batch gains a stage and drops the gradient sync
    (Metis's plan at 60 s on seed10/rob-009). Its screen is loose, so it is priced from within 5%."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.refine import refine, tail_stages
    from arachne.planners.protocol import Deadline

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "v{i}", "count": 2, "gpu": "V100-16", "gpus_per_node": 8, "inter_node_gbps": 12.5, "zone": "r0"},
        {"name": "a{i}", "count": 2, "gpu": "A10", "gpus_per_node": 4},
        {"name": "b", "gpu": "A10", "gpus_per_node": 8, "zone": "r1"},
        {"name": "g{i}", "count": 2, "gpu": "GH200", "gpus_per_node": 8, "zone": "r2"}]})
    ctx = ctx_for("LLAMA-3-8", gbs=16, seq=512, cluster=cl)
    assert [c.gpu.name for c in ctx.classes] == ["GH200-96GB", "A10", "A10", "V100-SXM2-16GB"]
    skip = Action("skip")
    own = State(0, (Action("own", 2, 1, 1, 2, 4), skip, skip, skip))
    assert tail_stages(ctx, own) == []  # no class has a node for each of the 4 replicas
    deep = tail_stages(ctx, own, deep=True)
    want = State(1, (Action("mix", 1, 1, 1, 16, 1), skip, skip, Action("mix", 8, 1, 1, 1, 1)))
    assert want in deep and all(t.mix_replicas == 1 for t in deep)
    pricer = Pricer(ctx)
    start = pricer.price_state(own)
    refine(ctx, pricer, own, Deadline(60))
    assert pricer.best()[2].tokens_per_s > 1.05 * start


def test_moe_rules_spread_experts_over_eight_tp2_groups_across_nodes():
    """Mixtral-8x22B on 17 MI300X nodes: Megatron's tp 2 x dp 64 x ep 8 (one stage) is 8 replicas of a
    stage of tp 2 x dp 8 x ep 8 over two nodes; the node-wide tp 1 rule alone needs two stages and is
    13% slower (seed22-b20/rob-027, where arachne was at 0.934x Megatron)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "m", "nodes": [{"name": "m{i}", "count": 17, "gpu": "MI300X"}]})
    ctx = ctx_for("Mixtral-8x22B", gbs=128, seq=8192, cluster=cl)
    acts = rule_own_actions(ctx, 0)
    megatron = Action("own", 2, 8, 8, 1, 8)
    assert megatron in acts and Action("own", 1, 8, 8, 2, 8) in acts
    pricer = Pricer(ctx)
    prices = {a: pricer.price_state(State(0, (a,))) for a in acts}
    assert max(prices, key=prices.get) == megatron
    assert prices[megatron] > 1.1 * prices[Action("own", 1, 8, 8, 2, 8)]
    assert all(a.tp * a.dp * a.stages * a.replicas <= 136 for a in acts)


def test_depth_regroupings_trade_pipeline_depth_for_stage_dp():
    """Half the stages at twice the dp (experts over the larger dp) or twice the stages at half the dp,
    the GPUs per replica unchanged; dense stages keep their dp inside a node."""
    from arachne.planners.arachne.search.refine import depth_regroupings

    cl = cluster_from_dict({"name": "m", "nodes": [{"name": "m{i}", "count": 17, "gpu": "MI300X"}]})
    moe = ctx_for("Mixtral-8x22B", gbs=128, seq=8192, cluster=cl)
    c = moe.classes[0]
    assert depth_regroupings(Action("own", 2, 1, 1, 8, 8), moe.model, c) == [Action("own", 2, 2, 2, 4, 8)]
    assert depth_regroupings(Action("own", 2, 8, 8, 1, 8), moe.model, c) == [Action("own", 2, 4, 4, 2, 8)]
    assert depth_regroupings(Action("mix", 1, 4, 4, 3, 2), moe.model, c) == [Action("mix", 1, 2, 2, 6, 2)]
    assert depth_regroupings(Action("skip"), moe.model, c) == []
    dense = ctx_for("LLaMA-2-7B", gbs=128, cluster=cl)
    assert depth_regroupings(Action("own", 4, 2, 1, 4, 2), dense.model, c) == [Action("own", 4, 1, 1, 8, 2)]
    assert depth_regroupings(Action("own", 1, 4, 1, 4, 2), dense.model, c) == [
        Action("own", 1, 8, 1, 2, 2), Action("own", 1, 2, 1, 8, 2)]


@given(hst.integers(1, 64))
def test_node_parts_tile_a_node_with_powers_of_two_largest_first(n):
    from arachne.planners.arachne.template import node_parts

    parts = node_parts(n)
    assert sum(size for _, size in parts) == n
    assert all(size & (size - 1) == 0 for _, size in parts)
    assert [size for _, size in parts] == sorted({size for _, size in parts}, reverse=True)  # distinct, descending
    assert [off for off, _ in parts] == [sum(s for _, s in parts[:k]) for k in range(len(parts))]


def odd_node_cluster():
    """Two H100 nodes that lost a GPU each (7 left) and three single-L4 nodes."""
    return cluster_from_dict({"name": "odd", "nodes": [
        {"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 7, "inter_node_gbps": 50},
        {"name": "l{i}", "count": 3, "gpu": "L4", "gpus_per_node": 1, "inter_node_gbps": 3.125}]})


def test_odd_nodes_are_planned_as_power_of_two_parts_covering_every_gpu_once():
    cl = odd_node_cluster()
    ctx = ctx_for("Mixtral-8x7B", gbs=64, seq=4096, cluster=cl)
    assert [(c.gpu.name, c.node_size, c.count) for c in ctx.classes] == [
        ("H100-SXM5-80GB", 4, 8), ("H100-SXM5-80GB", 2, 4), ("H100-SXM5-80GB", 1, 2), ("L4", 1, 3)]
    devs = [d for c in ctx.classes for node in c.node_devices() for d in node]
    assert sorted(devs) == sorted(cl.devices)


@pytest.mark.slow
def test_on_odd_nodes_a_pipeline_uses_wider_tp_than_divides_the_node():
    """Mixtral-8x7B needs all 14 H100s of two 7-GPU nodes. Before node parts, tp had to divide 7 (tp 1
    only, 14 one-GPU stages with recomputation, 0.70x Metis); a pipeline over the parts placed class by
    class crossed between the nodes at every part. Metis's plan (three tp 2 stages and one tp 1 stage
    per node, one crossing) is the reference arachne must reach."""
    from arachne.plan import Pipeline, Plan, Stage

    cl = odd_node_cluster()
    model = model_catalog().get("Mixtral-8x7B")
    job = Job(global_batch_size=64, sequence_length=4096)
    cm = CostModel(cl)
    plan, est, _ = run_planner("arachne", cl, model, job, cm)
    assert max(st.tp for p in plan.pipelines for st in p.stages) >= 2  # tp 4 since the MoE layer's traffic
    cuts = [(0, 5), (5, 10), (10, 14), (14, 16), (16, 18), (18, 23), (23, 28), (28, 32)]
    devs = [("h0:0", "h0:1"), ("h0:2", "h0:3"), ("h0:4", "h0:5"), ("h0:6",), ("h1:6",), ("h1:0", "h1:1"),
            ("h1:2", "h1:3"), ("h1:4", "h1:5")]
    metis = Plan(model="Mixtral-8x7B", global_batch_size=64, sequence_length=4096, micro_batch_size=1,
                 pipelines=[Pipeline(micro_batches=64, stages=[Stage(layers=a, devices=d, tp=len(d))
                                                               for a, d in zip(cuts, devs)])])
    ref = cm.estimate(metis)
    # with Megatron's fp32 main gradients (the memory model of 2026-12-02 afternoon) the tp 2 stages next to
    # the embedding and head need recomputation to fit: the reference recomputes the stages over capacity
    over = {r.stage for r in ref.stages if r.memory_bytes > r.capacity_bytes}
    if over:
        metis = metis.model_copy(update={"pipelines": [metis.pipelines[0].model_copy(update={"stages": [
            st.model_copy(update={"recompute": True}) if i in over else st
            for i, st in enumerate(metis.pipelines[0].stages)]})]})
        ref = cm.estimate(metis)
    assert ref.fits
    assert est.tokens_per_s >= 0.99 * ref.tokens_per_s
    # not class by class (a crossing at every part). Since the MoE layer's measured traffic (2026-12-03) the plan
    # has tp 4, 2 and 1 stages on both nodes, and node_contiguous orders within a run of one shape only: 3
    # crossings of 5 (a mirrored order, tp 4-2-1 on one node then 1-2-4, would cross once; 41,617 tokens/s
    # against the Metis planner's 41,983, which crosses once)
    nodes = [st.devices[0].split(":")[0] for p in plan.pipelines for st in p.stages]
    assert sum(a != b for a, b in zip(nodes, nodes[1:])) < len(nodes) - 1


def test_node_contiguous_groups_interchangeable_stages_by_node():
    from arachne.planners.arachne.completion.place import node_contiguous

    keys = [("H100", 2, 1, 1)] * 6 + [("H100", 1, 1, 1)] * 2
    devs = [("h0:0", "h0:1"), ("h0:2", "h0:3"), ("h1:0", "h1:1"), ("h1:2", "h1:3"), ("h0:4", "h0:5"),
            ("h1:4", "h1:5"), ("h0:6",), ("h1:6",)]
    out = node_contiguous(keys, devs)
    assert sorted(out) == sorted(devs)
    assert [d[0][:2] for d in out] == ["h0", "h0", "h0", "h1", "h1", "h1", "h1", "h0"]
    same = [("a:0",), ("a:1",), ("b:0",), ("b:1",)]
    assert node_contiguous([("A100", 1, 1, 1)] * 4, same) == same  # already contiguous: unchanged


def test_whole_node_view_keeps_every_slot_on_whole_nodes_or_inside_one():
    """Odd-sized nodes as whole-node classes (the second view): the MoE rule's tp 2 x dp 8 (16 GPUs) does not
    tile 6-GPU nodes, and placement refuses such a slot instead of handing the cost model a short stage (a
    crash on odd101/rob-001)."""
    from arachne.planners.arachne.search.rules import rule_own_actions
    from arachne.planners.arachne.template import slot_fits_nodes

    cl = cluster_from_dict({"name": "six", "nodes": [{"name": "r{i}", "count": 8, "gpu": "RTX-4090",
                                                      "gpus_per_node": 6}]})
    model, job = model_catalog().get("Qwen1.5-MoE-A2.7B"), Job(global_batch_size=96, sequence_length=8192)
    ctx = PlanningContext(cl, model, job, CostModel(cl), node_parts=False)
    assert [c.node_size for c in ctx.classes] == [6]
    acts = rule_own_actions(ctx, 0)
    assert acts and all(slot_fits_nodes(a.tp * a.dp, 6) for a in acts)
    assert place(Template((Group((Slot(0, 2, 8, 4),), 1),)), ctx) is None


def test_moe_rule_spreads_experts_over_eight_single_gpu_nodes():
    """64 single-GPU A100 nodes on a fast network: Megatron's one stage of dp 64 x ep 4 is 8 replicas of
    dp 8 x ep 4 across nodes; the tp 1 rule alone (no experts spread) is 11% slower (odd100/rob-017)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "ones", "nodes": [{"name": "a{i}", "count": 64, "gpu": "A100-80",
                                                       "gpus_per_node": 1, "inter_node_gbps": 200}]})
    ctx = ctx_for("Qwen1.5-MoE-A2.7B", gbs=2048, seq=512, cluster=cl)
    acts = rule_own_actions(ctx, 0)
    spread = Action("own", 1, 8, 4, 1, 8)
    assert spread in acts
    pricer = Pricer(ctx)
    prices = {a: pricer.price_state(State(0, (a,))) for a in acts}
    assert max(prices, key=prices.get) == spread
    assert prices[spread] > 1.1 * max(v for a, v in prices.items() if a.dp == 1)


@pytest.mark.slow
def test_odd_nodes_get_a_quick_pass_by_parts_then_whole_nodes_and_the_faster_plan_wins():
    """With odd-sized nodes (up to 512 GPUs) arachne first takes a quick pass over the nodes' power-of-two
    parts, then searches whole nodes as classes, and returns the faster plan: here tp 2 on the 7-GPU nodes
    (parts) beats whole nodes, which allow tp 1 only. Without odd nodes, one search."""
    from arachne.planners.arachne.planner import ArachnePlanner

    cl = odd_node_cluster()
    model, job = model_catalog().get("Mixtral-8x7B"), Job(global_batch_size=64, sequence_length=4096)
    cm = CostModel(cl)
    res = ArachnePlanner().plan(cl, model, job, cm, SearchBudget(time_budget_s=30))
    views = res.stats.notes["node_views"]
    assert set(views) == {"parts", "whole"} and views["parts"] < 0.8 * views["whole"]
    assert res.scores[0] == min(views.values())
    assert cm.estimate(res.plans[0]).iteration_time_s == pytest.approx(res.scores[0], rel=1e-6)
    whole = ArachnePlanner(parts_share=0).plan(cl, model, job, cm, SearchBudget(time_budget_s=30))
    assert "node_views" not in whole.stats.notes and whole.scores[0] == pytest.approx(views["whole"], rel=1e-9)
    big = ArachnePlanner(parts_max_gpus=16).plan(cl, model, job, cm, SearchBudget(time_budget_s=30))
    assert "node_views" not in big.stats.notes
    even = ArachnePlanner().plan(small_cluster(), model_catalog().get("GPT-3-1.3B"),
                                 Job(global_batch_size=64, sequence_length=2048), CostModel(small_cluster()),
                                 SearchBudget(time_budget_s=30))
    assert "node_views" not in even.stats.notes

@pytest.mark.slow
def test_refinement_moves_the_classes_in_use_before_the_unused_ones():
    """An unused slow class first in speed order (H100 pairs on 1.25 GB/s) has many options; refinement tries
    the used classes' moves first, so the A100 stages' regrouping (tp 2 -> tp 1 x dp 2) comes before them
    (odd105/rob-019, where the time ran out inside the H100 options at 0.977x Metis; the regrouping was +3.5%)."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.refine import refine
    from arachne.planners.protocol import Deadline

    cl = cluster_from_dict({"name": "r", "nodes": [
        {"name": "h{i}", "count": 14, "gpu": "H100", "gpus_per_node": 2, "inter_node_gbps": 1.25},
        {"name": "a{i}", "count": 7, "gpu": "A100-40", "gpus_per_node": 8, "inter_node_gbps": 200},
        {"name": "w{i}", "count": 2, "gpu": "H20", "gpus_per_node": 8, "inter_node_gbps": 100}]})
    ctx = ctx_for("LLaMA-2-7B", gbs=96, seq=1024, cluster=cl)
    assert [c.gpu.name for c in ctx.classes] == ["H100-SXM5-80GB", "A100-SXM4-40GB", "H20"]
    skip = Action("skip")
    start = State(4, (skip, Action("mix", 2, 1, 1, 7, 4), Action("mix", 4, 1, 1, 1, 4)))
    pricer = Pricer(ctx)
    seen: list[State] = []
    price = pricer.price_state
    pricer.price_state = lambda st: seen.append(st) or price(st)
    refine(ctx, pricer, start, Deadline(60), rounds=1)
    first_unused = next(i for i, st in enumerate(seen) if st.mix_replicas == 4 and st.actions[0] != skip)
    regrouped = State(4, (skip, Action("mix", 1, 2, 1, 7, 4), Action("mix", 4, 1, 1, 1, 4)))
    assert regrouped in seen[:first_unused]


def a40_a10_t4_cluster():
    """seed2/rob-013: 14 two-GPU nodes of a features-only A40, 40 single A10s and 21 single T4s."""
    return cluster_from_dict({"name": "j", "gpu_types": [
        {"name": "A40-48GB-c0", "memory_gb": 48, "peak_tflops": 149.7, "memory_bandwidth_gbps": 696,
         "intra_node_gbps": 64, "inter_node_gbps": 12.5, "intra_node_link": "pcie", "gpus_per_node": 4}],
        "nodes": [{"name": "a{i}", "count": 14, "gpu": "A40-48GB-c0", "gpus_per_node": 2},
                  {"name": "t{i}", "count": 21, "gpu": "T4", "gpus_per_node": 1},
                  {"name": "g{i}", "count": 40, "gpu": "A10", "gpus_per_node": 1}]})


def test_joint_depth_state_gives_every_class_its_own_depth():
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import floor_states, joint_depth_state

    # LLaMA-2-13B fits on the T4s only when the other classes' replicas shard the optimizer state too,
    # and the fewest stages that fit (the floor's all-classes template) are not the best depth for any class
    ctx = ctx_for("LLaMA-2-13B", gbs=1024, seq=1024, cluster=a40_a10_t4_cluster())
    st = joint_depth_state(ctx)
    assert st is not None and all(a.kind == "own" and a.stages >= 4 for a in st.actions)
    pricer = Pricer(ctx)
    core, _ = floor_states(ctx, pricer, price=False)
    assert pricer.price_state(st) > 1.1 * max(pricer.price_state(s) for s in core)
    moe = ctx_for("Mixtral-8x7B", gbs=1024, seq=1024, cluster=a40_a10_t4_cluster())
    assert joint_depth_state(moe) is None  # its dp 1 pipelines would hold every expert on every GPU


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"lead_first": True}, {"target_s": 2.0}])
def test_the_planner_finds_the_joint_depths(options):
    # screened first in the default pass (lead_first), or priced first in a longer target's extension
    ctx = ctx_for("LLaMA-2-13B", gbs=1024, seq=1024, cluster=a40_a10_t4_cluster())
    plan, est, _ = run_planner("arachne", ctx.cluster, ctx.model, ctx.job, ctx.cost_model, **options)
    assert est.tokens_per_s > 64_000  # 58,493 with mixed pipelines before the joint-depth rule
    types = [{ctx.cluster.devices[d].node.gpu.name for s in p.stages for d in s.devices} for p in plan.pipelines]
    assert all(len(t) == 1 for t in types) and len(set.union(*types)) == 3  # every class in its own pipelines


@pytest.mark.parametrize("model", ["DeepSeek-MoE-16B", "Mixtral-8x7B", "LLaMA-2-7B"])
def test_split_is_exact_on_real_profiles(model):
    # the greedy fill is exact for equal layers; real models (a dense first layer in DeepSeek-MoE, experts
    # sharded over dp 8) keep it exact: the bottleneck matches exhaustive search on mixed A100/V100 stages
    cl = cluster_from_dict({"name": "g", "nodes": [{"name": "a{i}", "count": 2, "gpu": "A100-80"},
                                                   {"name": "v{i}", "count": 2, "gpu": "V100-32"}]})
    ctx = ctx_for(model, gbs=64, seq=2048, cluster=cl)
    rnd, L = random.Random(0), ctx.model.num_layers
    ep, fitted = (8 if ctx.model.is_moe else 1), 0
    for _ in range(4):
        S = rnd.choice([2, 3])
        profiles = [ctx.slot_profile(rnd.randrange(2), 1, 8, ep, 8, S, 8, rnd.random() < 0.5) for _ in range(S)]
        r, best = split_layers(profiles, L, 1), brute_force_split(profiles, L, [0.0] * S)
        assert (r is None) == (best is None)
        assert r is None or r[1] <= best * (1 + 1e-4)
        fitted += r is not None
    assert fitted


def h100_h800_t4_cluster():
    """odd108/rob-001: one node each of H100, H800 and T4 (the T4 node on 3 Gb/s)."""
    return cluster_from_dict({"name": "h", "nodes": [
        {"name": "h800-{i}", "count": 1, "gpu": "H800"},
        {"name": "t4-{i}", "count": 1, "gpu": "T4", "gpus_per_node": 8, "inter_node_gbps": 3.125},
        {"name": "h100-{i}", "count": 1, "gpu": "H100", "gpus_per_node": 8}]})


def test_a_head_bound_pipeline_gets_a_wider_last_stage():
    from arachne.planners.arachne.completion.price import head_bound, wide_head

    # GPT-OSS-20B's head (a 201,088-token vocabulary on a 2,880 hidden) outweighs two blocks: in 16 one-GPU
    # stages the last one holds one block and the head and sets the pace; merged into one stage at tp 2 it does not
    ctx = ctx_for("GPT-OSS-20B", gbs=128, seq=512, cluster=h100_h800_t4_cluster())
    h100, h800 = (next(c.index for c in ctx.classes if c.gpu.name.startswith(n)) for n in ("H100", "H800"))
    tpl = Template((Group(tuple(Slot(h100, 1) for _ in range(8)) + tuple(Slot(h800, 1) for _ in range(8)), 1),))
    wide = wide_head(tpl, ctx)
    assert wide.groups[0].slots == tpl.groups[0].slots[:-2] + (Slot(h800, 2),)
    assert wide_head(Template((Group((Slot(h100, 1), Slot(h800, 1)), 1),)), ctx) is None  # two stages: no tail
    plain = price_template(tpl, ctx, heads=False)
    assert head_bound(plain[1])
    plan, est = price_template(tpl, ctx)
    assert est.tokens_per_s > 1.2 * plain[1].tokens_per_s
    last = plan.pipelines[0].stages[-1]
    assert last.tp == 2 and last.layers[1] - last.layers[0] == 1


@pytest.mark.slow
def test_the_planner_beats_sailors_pipeline_on_the_h100_h800_t4_cluster():
    """odd108/rob-001: Sailor's one-GPU-stage pipeline (212,397 tokens/s under the cost model of 2026-12-02, when
    arachne needed a widened head stage to pass it) against arachne's plan, both priced by today's model (since
    the MoE layer's measured traffic one stage of dp 16 x ep 4 wins by about 2x)."""
    ctx = ctx_for("DeepSeek-MoE-16B", gbs=128, seq=512, cluster=h100_h800_t4_cluster())
    _, est, _ = run_planner("arachne", ctx.cluster, ctx.model, ctx.job, ctx.cost_model)
    _, sailor, _ = run_planner("sailor", ctx.cluster, ctx.model, ctx.job, ctx.cost_model)
    assert est.tokens_per_s >= sailor.tokens_per_s


def test_refinement_first_pairs_a_slow_class_so_the_fast_one_gets_a_larger_micro_batch():
    """Single-GPU replicas of OPT-350M on 16 A100 and 20 V100: the V100s regrouped as 10 pairs of stage-level
    dp 2 let the plan's micro-batch double, so each A100 runs 2 sequences per micro-batch and each V100 still
    runs 1 (the pattern the exhaustive oracle found at 256 GPUs). A longer target's refinement screens it first."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.refine import batch_regroupings, refine
    from arachne.planners.protocol import Deadline

    cl = cluster_from_dict({"name": "p", "nodes": [
        {"name": "a{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8, "inter_node_gbps": 25},
        {"name": "v{i}", "count": 5, "gpu": "V100-16", "gpus_per_node": 4, "inter_node_gbps": 12.5}]})
    ctx = ctx_for("OPT-350M", gbs=144, seq=2048, cluster=cl)
    ctx.group_sizes = False  # with a micro-batch size per group, completion finds the same plan directly
    start = State(0, (Action("own", 1, 1, 1, 1, 16), Action("own", 1, 1, 1, 1, 20)))
    moves = batch_regroupings(ctx, start)
    assert moves[0].actions == (start.actions[0], Action("own", 1, 2, 1, 1, 10))
    assert all(sum(a.tp * a.dp * a.stages * a.replicas for a in m.actions) <= 36 for m in moves)
    assert batch_regroupings(ctx, State(0, (Action("own", 1, 1, 1, 2, 8), start.actions[1]))) == []
    pricer = Pricer(ctx)
    v0 = pricer.throughput(start.template())
    end = refine(ctx, pricer, start, Deadline(2, clock=lambda: len(pricer.cache)), regroup=True)
    assert end.actions[1].dp == 2
    best = pricer(end.template())
    assert best[0].micro_batch_size % 2 == 0 and best[1].tokens_per_s > 1.05 * v0


def test_floor_pairs_the_classes_that_do_best_alone_past_a_fast_type_on_a_slow_network():
    """L40S pairs on a 10 Gb/s network come first by speed, but the A800 and A100 nodes do more alone: the
    floor's data-parallel core then also holds those two together without the L40S, and it prices best."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import floor_states

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "l{i}", "count": 8, "gpu": "L40S", "gpus_per_node": 2, "inter_node_gbps": 10},
        {"name": "h{i}", "count": 2, "gpu": "A800-80", "gpus_per_node": 8, "inter_node_gbps": 100},
        {"name": "a{i}", "count": 4, "gpu": "A100-40", "gpus_per_node": 8, "inter_node_gbps": 100}]})
    best = {}
    for flag in (False, True):
        ctx = ctx_for("GPT-Neo-2.7B", gbs=256, seq=2048, cluster=cl)
        assert [c.gpu.name for c in ctx.classes][0] == "L40S"
        ctx.by_value_prefixes = flag
        pricer = Pricer(ctx)
        core, _ = floor_states(ctx, pricer, price=False)
        kinds = [tuple(a.kind for a in st.actions) for st in core]
        assert (("skip", "own", "own") in kinds) == flag
        best[flag] = max(pricer.price_state(st) for st in core)
    assert best[True] > 1.2 * best[False]


def test_a_batch_smaller_than_a_class_gets_one_stage_across_nodes_as_megatron_runs_it():
    """16 sequences on 32 A100 (4 nodes of 8): one stage of tp 2 x dp 16 (a sequence per group), past the
    policy's dp choices, is among the class's rule actions, and it completes to a fitting one-stage plan
    over all four nodes (odd113/rob-022: the Megatron grid's plan, 0.888x before the rule)."""
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "a{i}", "count": 4, "gpu": "A100-40", "gpus_per_node": 8, "inter_node_gbps": 100}]})
    for flag in (False, True):
        ctx = ctx_for("GPT-3-1.3B", gbs=16, seq=1024, cluster=cl)
        ctx.wide_small_batch = flag
        wide = [a for a in rule_own_actions(ctx, 0) if a.stages == 1 and a.dp == 16]
        assert bool(wide) == flag
    plan, est = price_template(State(0, (Action("own", 2, 16, 1, 1, 1),)).template(), ctx)
    validate_plan(plan, cl, ctx.model)
    (stage,) = [st for p in plan.pipelines for st in p.stages]
    assert est.fits and len(stage.devices) == 32 and stage.tp == 2 and stage.dp_size == 16



def test_the_wide_small_batch_rule_tries_every_tp():
    """32 sequences on 32 H20 (4 nodes of 8), OPT-30B: one stage of tp 4 x dp 8 is among the class's rule actions
    (the first rule tries only the least and the most tp; Megatron's grid found this one, seed35-rerun/rob-007)."""
    from arachne.planners.arachne.search.rules import rule_own_actions

    cl = cluster_from_dict({"name": "t", "nodes": [{"name": "h{i}", "count": 4, "gpu": "H20", "gpus_per_node": 8}]})
    ctx = ctx_for("OPT-30", gbs=32, seq=512, cluster=cl)
    acts = rule_own_actions(ctx, 0)
    assert Action("own", 4, 8, 1, 1, 1) in acts and len(acts) == len(set(acts))

@pytest.mark.slow
def test_a_gpu_type_split_across_node_sizes_is_pooled_into_identical_pipelines():
    """15 B200 in a node of 8 and a node of 7 (planned as parts 4, 2, 1): per class they make at most
    3 pipelines of 3 stages; pooled they make 5 pipelines of 3 over all 15, which beats data parallelism
    (a 7B model's whole gradient over every replica) and is what Sailor found (odd114/rob-010, 0.950x
    before the rule). The planner prices the pools once refinement is done."""
    from arachne.planners.arachne.search.pricer import Pricer
    from arachne.planners.arachne.search.rules import rule_pool, type_pool_states

    cl = cluster_from_dict({"name": "t", "nodes": [
        {"name": "b7", "count": 1, "gpu": "B200", "gpus_per_node": 7, "intra_node_gbps": 32},
        {"name": "b8", "count": 1, "gpu": "B200", "gpus_per_node": 8, "inter_node_gbps": 100}]})
    job = Job(global_batch_size=384, sequence_length=4096)
    for flag in (False, True):
        ctx = ctx_for("LLaMA-2-7B", gbs=384, seq=4096, cluster=cl)
        ctx.type_pools = flag
        assert bool(rule_pool(ctx, Pricer(ctx)).pools) == bool(flag)
    three = State(5, (Action("mix", 1, 1, 1, 3, 5, pool=True),) + (Action("skip"),) * (len(ctx.classes) - 1))
    assert three in type_pool_states(ctx, [Action("skip")] * len(ctx.classes))
    plan, est = price_template(three.template(), ctx)
    validate_plan(plan, cl, ctx.model)
    assert est.fits and len(plan.devices) == 15 and len(plan.pipelines) == 5
    got = {flag: run_planner("arachne", cl, ctx.model, job, CostModel(cl), SearchBudget(time_budget_s=30),
                             type_pools=flag, modern_knobs=False)[1].tokens_per_s for flag in (False, True)}
    # pooling wins by about 1.0% here (intra-node sends priced at NCCL's p2p share of the link)
    assert got[True] >= est.tokens_per_s > 1.005 * got[False]


def rob021_cluster():
    """seed35/rob-021: 1010 GPUs of 5 classes, a Gaudi2 type known only by its features."""
    return cluster_from_dict({"name": "rob-021", "nodes": [
        {"name": "g{i}", "count": 10, "gpu": "Gaudi2-HL225-c0", "gpus_per_node": 8},
        {"name": "t2-{i}", "count": 89, "gpu": "T4", "gpus_per_node": 2},
        {"name": "t4-{i}", "count": 45, "gpu": "T4", "gpus_per_node": 4},
        {"name": "p{i}", "count": 174, "gpu": "A100-PCIE-40", "gpus_per_node": 2},
        {"name": "a{i}", "count": 28, "gpu": "A100-40", "gpus_per_node": 8, "zone": "row-3"}],
        "gpu_types": [{"name": "Gaudi2-HL225-c0", "memory_gb": 96, "peak_tflops": 432, "memory_bandwidth_gbps": 2450,
                       "intra_node_gbps": 600, "inter_node_gbps": 300, "intra_node_link": "other",
                       "gpus_per_node": 1}]})


@pytest.mark.slow
def test_a_longer_target_screens_the_ranked_pool_past_the_default_pass():
    """On seed35/rob-021 (Qwen2-57B-A14B) the default pass screens only the ranker's first few templates; the
    extension screens further and finds the mixed Gaudi2 + A100 pipelines (196,357 -> 277,832 tokens/s at
    --target 2). The screening is measured alone: without the proxy's first rule, which finds most of it, and
    without the knob pass, whose work at --target 2 goes to the knobs of the default pass's plans."""
    cl = rob021_cluster()
    model, job = model_catalog().get("Qwen2-57B-A14B"), Job(global_batch_size=256, sequence_length=512)
    got = {t: run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=30),
                          target_s=t, proxy_first=0, modern_knobs=False)[1].tokens_per_s for t in (0.8, 2.0)}
    assert got[2.0] >= 1.1 * got[0.8]


@pytest.mark.slow
def test_the_mixed_rule_the_proxy_rates_best_is_screened_first():
    """Where the default pass screens 8 of 348 templates (seed35/rob-021), the mixed rule the throughput proxy
    rates best goes ahead of the ranker's order: 245,924 -> 278,805 tokens/s (0.983x -> 1.114x Sailor) with a
    batch of 256 under the cost model of 2026-12-02; since the MoE layer's measured traffic (2026-12-03) the
    rules' order decides it at a batch of 512: 189,218 -> 232,787 tokens/s."""
    cl = rob021_cluster()
    model, job = model_catalog().get("Qwen2-57B-A14B"), Job(global_batch_size=512, sequence_length=512)
    got = {k: run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=30),
                          proxy_first=k, modern_knobs=False)[1].tokens_per_s for k in (0, 1)}
    assert got[1] >= 1.1 * got[0]


def test_stages_with_tensor_parallelism_are_built_and_sized_with_sequence_parallelism():
    """A completion rule, not a knob: sequence parallelism costs no time in the cost model and holds a tp-th of
    the activations, so every stage of tp > 1 is built and sized with it (``sequence_parallel``). Sized without
    it (the knobs pass still turns it on afterwards), LLaMA-2-70B on two H100 nodes needs tp 8 to fit: 19% slower
    than the tp 2 pipeline it allows."""
    cl = cluster_from_dict({"name": "h", "nodes": [{"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 8}]})
    got = {}
    for sp in (True, False):
        _, est, res = run_planner("arachne", cl, model_catalog().get("LLaMA-2-70B"),
                                  Job(global_batch_size=64, sequence_length=4096), CostModel(cl), SearchBudget(),
                                  sequence_parallel=sp)
        stages = [st for p in res.plans[0].pipelines for st in p.stages]
        assert any(st.tp > 1 for st in stages) and all(st.sequence_parallel == (st.tp > 1) for st in stages)
        got[sp] = est.tokens_per_s
    assert got[True] > 1.1 * got[False]


def test_speed_grade_is_the_power_of_two_nearest_the_peak_ratio():
    """Sailor's plan for DeepSeek-MoE-16B on H200 and A100-80 (fresh hold-out odd100-rerun/rob-028, 1.11x arachne's
    plan then) ran the A100 stages at tp 4 beside H200 stages at tp 1; the graded rule doubled tp per slower type."""
    from arachne.planners.arachne.search.rules import speed_grade
    from arachne.spec.gpus import gpu_catalog

    gpus = gpu_catalog()
    h200, h100, a100, v100 = (gpus.get(n) for n in ("H200", "H100", "A100-80", "V100-32"))
    assert speed_grade(h200, h100, "bf16") == 1  # the same compute
    assert speed_grade(h200, a100, "bf16") == 4  # 989 / 312 TFLOP/s
    assert speed_grade(h100, v100, "bf16") == 8  # 989 / 125
    assert speed_grade(a100, h100, "bf16") == 1  # never narrower than the fastest type's
    assert speed_grade(h100, a100, "fp8") == speed_grade(h100, a100, "bf16")  # the A100 has no fp8 rate
