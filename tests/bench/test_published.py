"""``cost-model published``: the data file of published runs, its conversion to version-2 plans, the metric
conversions (hand-computed cases) and the subcommand."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from arachne.errors import InputError
from benchmarks import published as pub

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runs():
    return pub.load(pub.DATA)


def _doc() -> dict:
    return yaml.safe_load(pub.DATA.read_text())


def _write(tmp_path: Path, doc: dict) -> Path:
    p = tmp_path / "runs.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


# ---- the data ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_every_record_converts_to_a_valid_plan_on_its_cluster(runs):
    from arachne.cost import CostModel
    from arachne.plan import plan_from_dict
    from arachne.spec.cluster import cluster_from_dict

    assert len(runs.records) >= 15
    for rec in runs.records:
        cluster_doc, plan_doc, notes = pub.convert(runs, rec)
        cluster = cluster_from_dict(cluster_doc, rec.id)
        plan = plan_from_dict(plan_doc, rec.id)
        used = [d for p in plan.pipelines for s in p.stages for d in s.devices]
        assert len(used) == len(set(used)) == rec.gpus.count, rec.id
        est = CostModel(cluster).estimate(plan)  # validates the plan against cluster and model
        assert est.iteration_time_s > 0, rec.id
        assert notes["dp"] * rec.parallel.tp * rec.parallel.pp * rec.parallel.cp == rec.gpus.count


def test_records_are_traceable_and_split_about_half(runs):
    for rec in runs.records:
        src = runs.sources[rec.source.ref]
        assert src.url.startswith("https://") and rec.source.table
    for entry in runs.models.values():
        assert entry.source
    held = sum(r.held_out for r in runs.records)
    assert abs(held - len(runs.records) / 2) <= 1
    groups = {pub.group_of(pub.model_of(runs, r), r.gpus.type) for r in runs.records}
    assert groups == set(pub.GROUPS)


def test_step_times_agree_with_the_same_rows_throughput(runs):
    """A transcription check: where a row gives both step time and tokens/s/GPU, they agree to 1%."""
    checked = 0
    for rec in runs.records:
        tps = rec.reported.get("tokens_per_s_per_gpu")
        if rec.measured.step_time_s and tps:
            p = rec.parallel
            assert p.gbs * p.seq / (rec.measured.step_time_s * rec.gpus.count) == pytest.approx(tps, rel=0.01), rec.id
            checked += 1
    assert checked >= 5


def test_needs_follows_the_configuration(runs):
    by_id = {r.id: r for r in runs.records}
    rec = by_id["bridge-2602-h100-llama31-405b-fp8"]
    assert {"cp", "fp8", "interleaved"} <= set(pub.needs(runs, rec))
    rec = by_id["modelzoo-qwen3-235b-ep32-pp8"]
    assert {"ep_beyond_dp", "etp", "head_dim", "interleaved", "selective_recompute"} <= set(pub.needs(runs, rec))
    assert pub.unpriced(runs, rec) == []
    over = by_id["modelzoo-qwen3-235b-ep32-pp8-overlap"]
    assert "ep_overlap" in pub.needs(runs, over) and pub.unpriced(runs, over) == []  # the plan's overlap_moe_comm
    assert pub.convert(runs, over)[1]["overlap_moe_comm"] is True
    assert "overlap_moe_comm" not in pub.convert(runs, rec)[1]


def test_the_plan_carries_the_runs_configuration(runs):
    """ep over dp x tp with its own etp, interleaved chunks in Megatron's order, recomputation as stated."""
    rec = next(r for r in runs.records if r.id == "modelzoo-qwen3-235b-ep32-pp8")
    _, plan, notes = pub.convert(runs, rec)
    pipe = plan["pipelines"][0]
    S, v = rec.parallel.pp, rec.parallel.vp
    assert plan["format"] == "arachne-plan/2" and pipe["virtual_stages"] == v and notes["dp"] == 16
    st = pipe["stages"][0]
    assert (st["ep"], st["etp"], st["tp"], st["recompute"]) == (32, 1, 2, "selective")
    ranges = {tuple(r): (s, j) for s, stg in enumerate(pipe["stages"]) for j, r in enumerate(stg["layers"])}
    ordered = sorted(ranges)
    assert ordered[0][0] == 0 and ordered[-1][1] == 94 and all(x[1] == y[0] for x, y in zip(ordered, ordered[1:]))
    for i, r in enumerate(ordered):  # chunk j of stage s is range j*S + s in model order
        s, j = ranges[r]
        assert i == j * S + s
    assert len(ordered) == S * v


@pytest.mark.slow
def test_unstated_settings_come_from_the_source_defaults(runs, tmp_path):
    doc = _doc()
    ref = doc["records"][0]["source"]["ref"]
    doc["sources"][ref]["defaults"] = {"sequence_parallel": True, "zero_stage": 1, "overlap": True, "basis": "t"}
    doc["records"][0]["parallel"].pop("sequence_parallel", None)
    doc["records"][0]["parallel"].pop("zero_stage", None)
    r2 = pub.load(_write(tmp_path, doc))
    _, plan, _ = pub.convert(r2, r2.records[0])
    assert plan["zero_stage"] == 1 and plan["overlap_grad_reduce"] and plan["overlap_param_gather"]
    assert all(st.get("sequence_parallel") for st in plan["pipelines"][0]["stages"])
    doc["records"][0]["parallel"]["zero_stage"] = 0
    doc["records"][0]["parallel"]["sequence_parallel"] = False
    r3 = pub.load(_write(tmp_path, doc))
    _, plan, _ = pub.convert(r3, r3.records[0])
    assert plan["zero_stage"] == 0 and not any(st.get("sequence_parallel") for st in plan["pipelines"][0]["stages"])


# ---- metric conversions, by hand -------------------------------------------------------------------------------
def test_throughput_to_iteration_time():
    m = pub.Measured(tokens_per_s_per_gpu=14451)
    assert pub.measured_iteration_s(m, None, 8, 128, 8192) == pytest.approx(128 * 8192 / (14451 * 8))
    assert pub.measured_iteration_s(pub.Measured(tokens_per_s=37130), None, 8, 96, 2048) == pytest.approx(5.2953,
                                                                                                         rel=1e-4)
    assert pub.measured_iteration_s(pub.Measured(step_time_s=8.18), None, 256, 512, 4096) == 8.18


def test_flop_conventions_on_a_tiny_model():
    # l=1, h=6, s=6, V=72, B=1: 72*B*s*l*h^2 = 15552; (1 + s/6h + V/12lh) = 1 + 1/6 + 1 = 13/6
    spec = SimpleNamespace(num_layers=1, hidden_size=6, vocab_size=72, active_params=10)
    assert pub.flops_per_iteration("megatron", spec, 1, 6) == pytest.approx(33696)
    # 96*216 = 20736; (1 + 1/6 + 72/96) = 23/12
    assert pub.flops_per_iteration("megatron-recompute", spec, 1, 6) == pytest.approx(39744)
    # 6 * 10 params * 2 x 3 tokens; PaLM adds 12 l h s = 216 per token
    assert pub.flops_per_iteration("6n", spec, 2, 3) == pytest.approx(360)
    assert pub.flops_per_iteration("6n-attn", spec, 2, 3) == pytest.approx(1656)
    m = pub.Measured(tflops_per_gpu=1.0, flop_convention="megatron")
    assert pub.measured_iteration_s(m, spec, 2, 1, 6) == pytest.approx(33696 / 2e12)
    m = pub.Measured(mfu=0.5, peak_tflops=2.0, flop_convention="megatron")
    assert pub.measured_iteration_s(m, spec, 2, 1, 6) == pytest.approx(33696 / 2e12)


def test_layer_split_is_contiguous_and_even():
    assert pub.layer_split(61, 4) == [(0, 16), (16, 31), (31, 46), (46, 61)]
    with pytest.raises(InputError):
        pub.layer_split(3, 4)


# ---- bad input: one error naming file and field -------------------------------------------------------------
@pytest.mark.parametrize("edit, field", [
    (lambda d: d["records"][0]["measured"].update(step_time_s=1.0), "records[0].measured"),
    (lambda d: d["records"][1]["source"].update(ref="nowhere"), "records[1].source.ref"),
    (lambda d: d["records"][2]["parallel"].update(gbs=1001), "records[2].parallel.gbs"),
    (lambda d: d["records"][0]["parallel"].update(speed=3), "records[0].parallel.speed"),
    (lambda d: d["records"][3].update(id=d["records"][0]["id"]), "records[3].id"),
    (lambda d: d["records"][0].update(extra_features=["warp"]), "records[0].extra_features"),
    (lambda d: d["records"][0].update(model="No-Such-Model"), "records[0].model"),
    (lambda d: d["records"][4]["gpus"].update(type="Z9000"), "records[4].gpus.type"),
    (lambda d: d["records"][5]["gpus"].update(count=12), "records[5].gpus.count"),
])
@pytest.mark.slow
def test_bad_records_name_the_field(tmp_path, edit, field):
    doc = _doc()
    edit(doc)
    with pytest.raises(InputError) as e:
        pub.load(_write(tmp_path, doc))
    assert field in str(e.value) and "runs.yaml" in str(e.value)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.integers(1, 16), cp=st.sampled_from([1, 2]), dp=st.integers(1, 6),
       mbs=st.integers(1, 4), ga=st.integers(1, 8))
def test_any_megatron_layout_converts_to_a_valid_plan(runs, tp, pp, cp, dp, mbs, ga):
    """tp x pp x cp x dp GPUs (whole nodes of up to 8) always give a plan that validates on its cluster and
    uses every GPU exactly once, with the stated tp, pp, cp and global batch."""
    from arachne.cost import CostModel
    from arachne.plan import plan_from_dict
    from arachne.spec.cluster import cluster_from_dict

    base = runs.records[0]  # LLaMA-3-70B: 80 blocks, 64 heads
    count = tp * pp * cp * dp
    gpus = base.gpus.model_copy(update={"count": count, "per_node": math.gcd(count, 8)})
    par = base.parallel.model_copy(update={"tp": tp, "pp": pp, "cp": cp, "vp": 1, "mbs": mbs,
                                           "gbs": mbs * dp * ga, "seq": 2048})
    rec = base.model_copy(update={"gpus": gpus, "parallel": par})
    cluster_doc, plan_doc, notes = pub.convert(runs, rec)
    plan = plan_from_dict(plan_doc, rec.id)
    used = [d for p in plan.pipelines for s in p.stages for d in s.devices]
    assert len(used) == len(set(used)) == count
    assert len(plan.pipelines[0].stages) == pp and {(s.tp, s.cp) for s in plan.pipelines[0].stages} == {(tp, cp)}
    assert notes["dp"] == dp and plan.global_batch_size == par.gbs
    assert CostModel(cluster_from_dict(cluster_doc, rec.id)).estimate(plan).iteration_time_s > 0


# ---- the subcommand ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_subcommand_writes_rows_and_groups(tmp_path, runs):
    pub.run(Namespace(data=None, out=tmp_path))
    doc = json.loads((tmp_path / "published.json").read_text())
    assert doc["benchmark"] == "cost-model-published"
    assert [r["id"] for r in doc["rows"]] == [r.id for r in runs.records]
    assert doc["summary"]["fitted_on_these_runs"] == []
    for r in doc["rows"]:
        assert r["fair"] == (r["unpriced"] == "-")
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_s"] - r["measured_s"]) / r["measured_s"])
    grouped = sum(g["runs"] for g in doc["summary"]["groups"] if g["group"] not in ("memory", "all"))
    assert grouped == len(runs.records)


@pytest.mark.slow
def test_cli_bad_file_is_one_line_exit_2(tmp_path):
    doc = _doc()
    doc["records"][0]["gpus"]["count"] = 0
    res = subprocess.run([sys.executable, "-m", "benchmarks", "cost-model", "published", "--data",
                          str(_write(tmp_path, doc)), "--out", str(tmp_path)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=False)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "records[0].gpus.count" in res.stderr
