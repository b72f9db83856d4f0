"""Elastic training end to end on CPU: simulated nodes as torch elastic agents, one killed, one joining.

Three simulated nodes (2, 1 and 1 devices) start a job; at a random step (seeded) the agent of a node the
plan uses is killed with its process group (SIGKILL); a fourth node is started at the same moment and asks to join.
The run must reach its last step with the losses of single-process full-batch training (the same for any
plan, so it is the reference of a run that switches plans at the same steps), train no step twice after a
restore point, and leave no process behind.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from procs import descendants

from arachne.plan import plan_from_dict, validate_plan
from arachne.runtime import checkpoint as ckpt
from arachne.runtime.elastic_agent import ElasticConfig, ElasticJob, run_elastic
from arachne.runtime.reference import reference_run
from arachne.spec.cluster import cluster_from_dict

pytestmark = [pytest.mark.torch]

SEED = 5
STEPS = 50
# a slow simulated GPU with little memory beyond the fixed per-GPU overhead, so that the planner spreads the
# tiny model over more than one device
SIM = {"name": "SIM", "memory_gb": 5.06, "peak_tflops": 10, "memory_bandwidth_gbps": 100, "intra_node_gbps": 10,
       "inter_node_gbps": 1}
NODES = [{"name": "n0", "gpu": "SIM", "gpus_per_node": 2}, {"name": "n1", "gpu": "SIM", "gpus_per_node": 1},
         {"name": "n2", "gpu": "SIM", "gpus_per_node": 1}, {"name": "n3", "gpu": "SIM", "gpus_per_node": 2}]




def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _copies_match_the_checkpoint(root: Path) -> int:
    """Every node-local copy of the newest step equals the checkpoint's slice bit for bit (replicas included:
    what makes a moved restore bit-identical to a reload whichever copy serves it); how many were compared."""
    latest = ckpt.latest(root)
    meta = ckpt.read_meta(latest)
    reader, n = ckpt.CheckpointReader(latest), 0
    for f in sorted(root.glob(f"{ckpt.LOCAL}/*/gpu-*/step-{meta['step']:06d}.pt")):
        pieces = ckpt.load_local(root, f"{f.parent.parent.name}:{f.parent.name[4:]}", meta["step"], meta["save_id"])
        for name, ps in (pieces or {}).items():
            for p in ps:
                for k in ckpt.STATE_KEYS:
                    full = reader.get(name, k)
                    ref = full if p["dim"] is None else full.narrow(p["dim"], p["start"], p["stop"] - p["start"])
                    assert torch.equal(p[k], ref), (f, name, k, p["writer"])
                    n += 1
    return n


@pytest.mark.slow
def test_node_lost_by_kill_and_node_joining(rt, tmp_path):
    cluster = cluster_from_dict({"name": "elastic", "nodes": NODES, "gpu_types": [SIM]})
    doc = rt.make_plan(rt.DENSE, [{"micro_batches": 4, "stages": [
        {"layers": [0, 2], "devices": ["n0:0", "n0:1"], "tp": 2}, {"layers": [2, 4], "devices": ["n1:0"]}]}])
    plan = plan_from_dict(doc, "plan")
    model = validate_plan(plan, cluster, source="plan")
    kill_at = random.Random(SEED).randint(2, 6)
    seen: list[dict] = []
    state: dict = {"victim": None, "devices": None, "procs": set()}

    def on_record(d: dict, job: ElasticJob) -> None:
        seen.append(d)
        state["procs"] |= descendants(os.getpid())
        if "event" in d:
            state["devices"] = d["devices"]
        elif d["step"] >= kill_at and state["victim"] is None:
            state["victim"] = state["devices"][0].split(":")[0]  # a node the running plan uses
            job.kill(state["victim"])
            job.add("n3")  # a fourth node starts (seconds to import torch) and asks to join

    cfg = ElasticConfig(steps=STEPS, checkpoint_dir=tmp_path / "ck", checkpoint_every=2, horizon_steps=10**9,
                        initial_nodes=["n0", "n1", "n2"], seed=SEED, timeout_s=30, min_step_s=0.3,
                        job_timeout_s=240)
    res = run_elastic(plan, model, cluster, cfg, on_record)

    # it reached its last step, with the reference losses, through every plan
    ref = reference_run(model, plan.global_batch_size, plan.sequence_length, STEPS, seed=SEED)
    assert {r["step"] for r in res.records} == set(range(STEPS))
    assert res.records[-1]["step"] == STEPS - 1
    for r in res.records:
        assert abs(r["loss"] - ref.losses[r["step"]]) <= 1e-5 * abs(ref.losses[r["step"]]), r
    assert ckpt.read_meta(ckpt.latest(tmp_path / "ck"))["step"] == STEPS

    # no step trained twice after a restore point: after each restore the steps run on from it, once each
    expect: int | None = None
    for d in seen:
        if "event" in d:
            if d["resumed_from_step"] is not None:
                expect = d["resumed_from_step"]
            continue
        assert expect is None or d["step"] == expect, (d, expect)
        expect = d["step"] + 1

    # the loss and the join were both seen, with the timings reported
    victim = state["victim"]
    lost = [e for e in res.events if any(x.startswith(victim + ":") for x in e["lost"])]
    assert len(lost) == 1 and lost[0]["event"] in ("replan", "keep")
    assert lost[0]["resumed_from_step"] <= kill_at + 1
    joins = [e for e in res.events if "n3:0" in e["joined"] and e["event"] != "start"]
    assert len(joins) == 1 and joins[0]["event"] in ("replan", "keep"), res.events
    for e in res.events:
        print({k: e.get(k) for k in ("event", "reason", "detect_s", "rendezvous_s", "plan_s", "restore_s",
                                     "resumed_from_step", "restore", "restore_reason", "migrate_s_est",
                                     "reload_s_est", "moved_bytes")})
    print(res.summary)
    for e in lost + [j for j in joins if j["event"] == "replan"]:  # each part reported (its size is a measurement,
        assert all(e[k] >= 0 for k in ("detect_s", "plan_s", "restore_s"))  # printed above, not a test)

    # the restore path each event reports is the one that ran: a taken join's state (all of it on members'
    # node-local copies, moving estimated far cheaper than a reload) moved over the round's group, the losses above
    # matching (the planner may also find no faster plan with n3: then n3 stays idle and nothing is restored)
    assert all(e["restore"] in ("migrate", "reload", "none") for e in res.events)
    # a taken join moves its state, or says which piece no member held (then it reloads: seen once under load, the
    # node-local copy of the join's step missing on a member; an open problem, not hidden)
    assert all((j["restore"] == "migrate" and j["moved_bytes"] > 0)
               or (j["restore"] == "reload" and "cannot move step" in (j["restore_reason"] or ""))
               for j in joins if j["event"] == "replan"), joins
    assert all(e.get("moved_bytes", 0) == 0 for e in res.events if e["restore"] != "migrate"), res.events
    assert all(e["restore_reason"] for e in res.events if e["event"] != "start"), res.events
    final = res.events[-1]["devices"]
    assert all((ckpt.local_dir(tmp_path / "ck", d) / f"step-{STEPS:06d}.pt").is_file() for d in final)
    assert _copies_match_the_checkpoint(tmp_path / "ck") > 0
    assert res.summary["steps"] == STEPS and res.summary["steps_lost"] >= 0

    # no process left behind
    assert state["procs"], "no agent was ever seen"
    assert not [p for p in state["procs"] if _alive(p)]
    assert not [p for p in descendants(os.getpid()) if _alive(p)]


def _kept(root: Path, step: int, devices: list[str]) -> bool:
    """After the record of ``step`` and no save in flight (``checkpoint_every=2``: none starts after an even
    step; one in flight keeps its ``.tmp-step-N`` until assembled): the newest checkpoint is complete and every
    device kept its node-local copy of it, so a worker killed now loses none of the state to restore."""
    latest = ckpt.latest(root)
    if step % 2 or latest is None or any(root.glob(".tmp-step-*")):
        return False
    done = ckpt.read_meta(latest)["step"]
    return all((ckpt.local_dir(root, d) / f"step-{done:06d}.pt").is_file() for d in devices)


@pytest.mark.slow
def test_a_killed_worker_restarts_its_round_from_the_checkpoint(rt, tmp_path):
    """Only a worker process dies (SIGKILL), its agent stays: same membership, the plan is re-decided and the
    run resumes from the last checkpoint."""
    import signal

    cluster = cluster_from_dict({"name": "elastic", "nodes": NODES[:2], "gpu_types": [SIM]})
    plan = plan_from_dict(rt.make_plan(rt.DENSE, [{"micro_batches": 4, "stages": [
        {"layers": [0, 4], "devices": ["n0:0"]}]}]), "plan")
    model = validate_plan(plan, cluster, source="plan")
    kill_at = random.Random(SEED + 1).randint(2, 5)
    state: dict = {"devices": None, "killed": None, "procs": set()}

    def on_record(d: dict, job: ElasticJob) -> None:
        state["procs"] |= descendants(os.getpid())
        if "event" in d:
            state["devices"] = d["devices"]
        elif d["step"] >= kill_at and state["killed"] is None:
            state["clean"] = _kept(tmp_path / "ck", d["step"], state["devices"])
            if not state["clean"] and d["step"] < kill_at + 6:  # (a machine too loaded: kill at a later step anyway)
                return
            agent = job.agents[state["devices"][0].split(":")[0]].pid
            state["killed"] = min(descendants(agent))  # one of that node's workers
            os.kill(state["killed"], signal.SIGKILL)

    cfg = ElasticConfig(steps=16, checkpoint_dir=tmp_path / "ck", checkpoint_every=2, seed=SEED, timeout_s=30,
                        min_step_s=0.2, job_timeout_s=180)
    res = run_elastic(plan, model, cluster, cfg, on_record)
    ref = reference_run(model, plan.global_batch_size, plan.sequence_length, 16, seed=SEED)
    assert {r["step"] for r in res.records} == set(range(16))
    for r in res.records:
        assert abs(r["loss"] - ref.losses[r["step"]]) <= 1e-5 * abs(ref.losses[r["step"]]), r
    restarts = [e for e in res.events if e["event"] != "start"]
    assert len(restarts) == 1 and restarts[0]["reason"].startswith("workers restarted after a failure"), res.events
    assert restarts[0]["lost"] == [] and restarts[0]["resumed_from_step"] <= kill_at + 7
    print({k: restarts[0].get(k) for k in ("event", "reason", "detect_s", "plan_s", "restore_s", "restore",
                                           "restore_reason", "moved_bytes")})
    # no node left, every copy of the newest step kept: the state moved (else it could have been killed while
    # keeping its copy of a step that then completed: a reload, with the reason)
    assert restarts[0]["restore"] == "migrate" or not state["clean"] and \
        restarts[0]["restore_reason"].startswith("cannot move step"), (restarts[0], state["clean"])
    assert _copies_match_the_checkpoint(tmp_path / "ck") > 0
    assert not [p for p in state["procs"] if _alive(p)]


def _main(monkeypatch, capsys, *args) -> tuple[int, str]:
    import sys

    from arachne.cli.app import main

    monkeypatch.setattr(sys, "argv", ["arachne", *[str(a) for a in args]])
    with pytest.raises(SystemExit) as info:
        main()
    return int(info.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("extra,flag", [([], "--elastic"), (["--simulate-devices"], "--checkpoint-dir"),
                                        (["--simulate-devices", "--checkpoint-dir", "CK", "--min-nodes", "9"],
                                         "--min-nodes")])
def test_elastic_flags_are_one_line_errors(monkeypatch, capsys, rt, tmp_path, extra, flag):
    import json

    import yaml

    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({"name": "e", "nodes": NODES[:2], "gpu_types": [SIM]}))
    (tmp_path / "plan.json").write_text(json.dumps(rt.make_plan(rt.DENSE, [{"micro_batches": 4, "stages": [
        {"layers": [0, 4], "devices": ["n0:0"]}]}])))
    extra = [str(tmp_path / "ck") if a == "CK" else a for a in extra]
    code, err = _main(monkeypatch, capsys, "run", "-c", tmp_path / "cluster.yaml", "-p", tmp_path / "plan.json",
                      "--elastic", *extra)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err
