"""Moving state between the members of an elastic round gives exactly what reloading the checkpoint gives.

A synthetic step is saved the way the elastic saver saves it: every device of the old plan keeps all its
pieces node-locally, the writers' pieces are assembled into the shared checkpoint. On devices that only serve
(the new plan does not use them) pieces that are not writers' are nudged by one ulp, so a move that took such
a replica where a writer's piece survives would not be bit-identical to the reload. (In training, replicas are
bit-identical: ``test_elastic`` checks every node-local copy against the checkpoint.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from arachne.plan import Plan, plan_from_dict, validate_plan
from arachne.runtime import checkpoint as ckpt
from arachne.runtime import state_move as sm
from arachne.runtime.elastic import state_survives
from arachne.runtime.engine import Worker, WorkerConfig
from arachne.runtime.layout import Layout
from arachne.runtime.model import shard
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.model import ModelSpec

pytestmark = [pytest.mark.torch]

CLUSTER = {"name": "four", "nodes": [{"name": n, "gpu": "A100-40", "gpus_per_node": 2} for n in "abcd"]}
STEP = 6
SERVE_ONLY = {"a:0", "a:1", "b:0", "c:0"}  # old plan devices the new plans leave out


def _stage(a: int, b: int, devs: list[str], **kw: Any) -> dict[str, Any]:
    return {"layers": [a, b], "devices": devs, **kw}


def _plans(rt: Any, model: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An old plan over nodes a, b, c and a new one over b and d (c left idle)."""
    n, h = model["num_layers"], model["num_layers"] // 2
    old = rt.make_plan(model, [
        {"micro_batches": 2, "stages": [_stage(0, h, ["a:0", "a:1"], tp=2), _stage(h, n, ["b:0", "b:1"], tp=2)]},
        {"micro_batches": 2, "stages": [_stage(0, n, ["c:0"])]}])
    new = rt.make_plan(model, [{"micro_batches": 4, "stages": [
        _stage(0, 1, ["d:0"]), _stage(1, n, ["d:1", "b:1"], tp=2, allow_cross_node_tp=True)]}])
    return old, new


def _load(doc: dict[str, Any]) -> tuple[Plan, ModelSpec]:
    plan = plan_from_dict(doc, "plan")
    return plan, validate_plan(plan, cluster_from_dict(CLUSTER), source="plan")


def _save_step(root: Path, plan: Plan, model: ModelSpec, nudge: set[str], seed: int = 0) -> dict[str, dict[str, Any]]:
    """Save a random step under ``plan`` as the elastic saver does (the non-writer pieces of the devices in
    ``nudge`` one ulp off); returns the canonical state."""
    lay = Layout(plan, model, list(plan.devices))
    g = torch.Generator().manual_seed(seed)
    full = {name: {k: torch.randn(hs[0][1].shape, generator=g) for k in ckpt.STATE_KEYS}
            for name, hs in lay.holders.items()}
    for state in full.values():
        state["exp_avg_sq"] = state["exp_avg_sq"].abs() * 1e-3
    sid = f"test-{STEP}"
    for role in lay.roles:
        writes = set(lay.checkpoint_writers.get(role.rank, []))
        pieces: dict[str, list[dict[str, Any]]] = {}
        for spec in lay.param_specs(role):
            piece: dict[str, Any] = {"dim": spec.dim, "start": spec.start, "stop": spec.stop, "writer": spec in writes}
            for k in ckpt.STATE_KEYS:
                t = shard(full[spec.name][k], spec).clone()
                piece[k] = t if spec in writes or role.device not in nudge else torch.nextafter(t, t + 1)
            pieces.setdefault(spec.name, []).append(piece)
        ckpt.save_local(root, role.device, STEP, sid, pieces)
        shared = {n: [p for p in ps if p["writer"]] for n, ps in pieces.items()}
        if any(shared.values()):
            ckpt.save_pieces(root, STEP, role.rank, {n: ps for n, ps in shared.items() if ps})
    shapes = {name: hs[0][1].shape for name, hs in lay.holders.items()}
    ckpt.assemble(root, STEP, shapes, {"step": STEP, "samples": 48, "optimizer": plan.optimizer, "save_id": sid})
    return full


def _reload(root: Path, plan: Plan, model: ModelSpec) -> dict[str, dict[Any, dict[str, Any]]]:
    """What each device of ``plan`` gets from the shared checkpoint."""
    reader = ckpt.CheckpointReader(ckpt.latest(root))
    return {dev: {s: {k: shard(reader.get(s.name, k), s) for k in ckpt.STATE_KEYS} for s in specs}
            for dev, specs in sm.targets(plan, model).items()}


def _move(root: Path, plan: Plan, model: ModelSpec, members: list[str]) -> tuple[Any, Any]:
    """The moves among ``members`` (each opening only its own node-local copy) and what they deliver."""
    locals_ = [sm.open_local(root, d) for d in members]
    holders = [(d, lc.manifest) for d, lc in zip(members, locals_)]
    moves, why = sm.plan_moves(holders, plan, model, sm.state_keys(plan, STEP))
    if moves is None:
        return None, why
    specs = {members.index(d): s for d, s in sm.targets(plan, model).items()}
    got = sm.gather(moves, [lc.flat for lc in locals_], specs, sm.state_keys(plan, STEP))
    return moves, {members[r]: st for r, st in got.items()}


def _holds(held: list[sm.Held], specs: list[Any], m: sm.Move) -> bool:
    """Whether ``held`` covers the segment of move ``m`` (``specs``: its receiver's targets)."""
    name = specs[m.target].name
    return any(h.name == name and (h.dim is None or m.dim is not None and h.dim == m.dim and h.start <= m.lo and
                                   m.hi <= h.stop) for h in held)


def _assert_identical(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert set(got) == set(ref)
    for dev, want in ref.items():
        assert set(got[dev]) == set(want), dev
        for spec, keys in want.items():
            for k, t in keys.items():
                assert torch.equal(got[dev][spec][k], t), (dev, spec.name, k)


@pytest.mark.parametrize("which", ["DENSE", "GQA_TIED", "MOE"])
def test_moved_state_is_bit_identical_to_the_reload(rt, tmp_path, which):
    old, new = (_load(d) for d in _plans(rt, getattr(rt, which)))
    model = old[1]
    _save_step(tmp_path, old[0], model, nudge=SERVE_ONLY)
    members = ["c:1", "a:0", "d:0", "b:1", "a:1", "c:0", "d:1", "b:0"]  # nobody left; d joined (holds nothing)
    moves, got = _move(tmp_path, new[0], model, members)
    assert moves is not None, got
    _assert_identical(got, _reload(tmp_path, new[0], model))
    # b:1 serves itself every segment it holds (writer shards and replicated norms alike); d's devices hold nothing
    b1, mine = members.index("b:1"), sm.open_local(tmp_path, "b:1").manifest
    to_b1 = [m for m in moves if m.dst == b1]
    assert any(m.src == b1 for m in to_b1) and all(m.src == b1 for m in to_b1
                                                      if _holds(mine, sm.targets(new[0], model)["b:1"], m))
    assert not any(members[m.src].startswith("d:") for m in moves)


def test_a_node_that_left_serves_nothing_and_replicas_stand_in(rt, tmp_path):
    (plan_old, model), (plan_new, _) = (_load(d) for d in _plans(rt, rt.DENSE))
    _save_step(tmp_path, plan_old, model, nudge=set())
    members = ["b:0", "b:1", "c:0", "c:1", "d:0", "d:1"]  # node a left; its files are still on disk
    assert sm.ckpt.local_dir(tmp_path, "a:0").is_dir()
    moves, got = _move(tmp_path, plan_new, model, members)
    assert moves is not None, got
    assert {members[m.src].split(":")[0] for m in moves} <= {"b", "c"}
    assert any(members[m.src] == "c:0" for m in moves)  # layers 0..1 only survive on pipeline 1's replica
    _assert_identical(got, _reload(tmp_path, plan_new, model))


def test_a_missing_piece_makes_the_restore_a_reload_with_the_reason(rt, tmp_path):
    (plan_old, model), (plan_new, _) = (_load(d) for d in _plans(rt, rt.DENSE))
    _save_step(tmp_path, plan_old, model, nudge=set())
    (sm.ckpt.local_dir(tmp_path, "c:0") / f"step-{STEP:06d}.pt").unlink()  # c:0 was killed before keeping it
    assert state_survives(plan_old, ["a:0", "a:1"])  # the layer-level check cannot see this
    moves, why = _move(tmp_path, plan_new, model, ["b:0", "b:1", "c:0", "c:1", "d:0", "d:1"])
    assert moves is None and why == "no remaining member holds embed.tok (needed by d:0)"


def test_a_copy_of_another_save_is_not_used(rt, tmp_path):
    (plan_old, model), (plan_new, _) = (_load(d) for d in _plans(rt, rt.DENSE))
    _save_step(tmp_path, plan_old, model, nudge=set())
    meta = ckpt.read_meta(ckpt.latest(tmp_path))
    (ckpt.latest(tmp_path) / "meta.json").write_text(json.dumps({**meta, "save_id": "another-run-6"}))
    assert sm.open_local(tmp_path, "b:1").flat == []
    moves, _ = _move(tmp_path, plan_new, model, ["a:0", "a:1", "b:0", "b:1", "c:0", "c:1", "d:0", "d:1"])
    assert moves is None


def test_local_copies_older_than_the_newest_step_are_pruned(tmp_path):
    for step in (2, 4, 6):
        ckpt.save_local(tmp_path, "n1:0", step, f"x-{step}", {})
    (ckpt.local_dir(tmp_path, "n1:0") / ".tmp-step-000008.pt").write_bytes(b"half")
    ckpt.prune_local(tmp_path, "n1:0", 4)
    assert sorted(p.name for p in ckpt.local_dir(tmp_path, "n1:0").iterdir()) == ["step-000004.pt", "step-000006.pt"]
    assert ckpt.load_local(tmp_path, "n1:0", 4, "x-4") == {} and ckpt.load_local(tmp_path, "n1:0", 4, "y-4") is None


@pytest.mark.slow
def test_a_worker_restored_by_a_move_trains_as_one_restored_from_the_checkpoint(rt, tmp_path):
    """The engine's own restore (checkpoint files) against build-then-apply_state, one step on each."""
    (plan_old, model), _ = (_load(d) for d in _plans(rt, rt.GQA_TIED))
    _save_step(tmp_path, plan_old, model, nudge=SERVE_ONLY)
    doc = rt.make_plan(rt.GQA_TIED, [{"micro_batches": 4, "stages": [_stage(0, 3, ["d:0"])]}])
    plan, _ = _load(doc)
    members = ["a:0", "a:1", "b:0", "b:1", "c:0", "c:1", "d:0"]
    moves, got = _move(tmp_path, plan, model, members)
    assert moves is not None, got
    base = {"plan": doc, "model": model.model_dump(), "order": ["d:0"], "seed": 3, "start_step": STEP}
    ref = Worker(0, WorkerConfig(**base, resume_from=str(ckpt.latest(tmp_path))), lambda _: None)
    ref.build()
    moved = Worker(0, WorkerConfig(**base), lambda _: None)
    moved.build()
    sm.apply_state(moved, got["d:0"], STEP)
    for w in (ref, moved):
        w.loss = w.step(48)
    assert ref.loss == moved.loss
    for (s, p), (s2, p2) in zip(ref.entries, moved.entries):
        assert s == s2 and torch.equal(p, p2), s.name
        for k in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ref.opt.state[p][k], moved.opt.state[p2][k]), (s.name, k)


CHILD = r"""
import json, sys
from pathlib import Path
import torch, torch.distributed as dist
from arachne.plan import plan_from_dict
from arachne.runtime import state_move as sm
from arachne.spec.model import ModelSpec
rank, world, root, init, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
cfg = json.loads(Path(sys.argv[6]).read_text())
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
me = cfg["members"][rank]
local = sm.open_local(root, me)
holders = [None] * world
dist.all_gather_object(holders, (me, local.manifest))
plan, model = plan_from_dict(cfg["plan"], "plan"), ModelSpec(**cfg["model"])
keys = sm.state_keys(plan, local.step)
box = [sm.plan_moves(holders, plan, model, keys)[0] if rank == 0 else None]
dist.broadcast_object_list(box, 0)
state, nbytes = sm.execute(box[0], rank, local.flat, sm.targets(plan, model).get(me, []), keys)
torch.save({"bytes": nbytes, "state": [((s.name, s.dim, s.start, s.stop), v) for s, v in state.items()]},
           out / f"{me}.pt")
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_transfer_over_gloo_delivers_the_reload(rt, tmp_path):
    (plan_old, model), (plan_new, _) = (_load(d) for d in _plans(rt, rt.GQA_TIED))
    root, out = tmp_path / "ck", tmp_path / "out"
    out.mkdir()
    _save_step(root, plan_old, model, nudge=set())  # replicas equal: node a, a writer, is gone
    members = ["d:1", "b:1", "c:0", "b:0", "d:0"]  # node a left; ranks not in device order
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"members": members, "plan": plan_new.to_doc(), "model": model.model_dump()}))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(r), str(len(members)), str(root),
                               str(tmp_path / "init"), str(out), str(cfg)], env=env) for r in range(len(members))]
    try:
        assert [p.wait(timeout=120) for p in procs] == [0] * len(members)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    ref = _reload(root, plan_new, model)
    received = 0
    for dev in members:
        doc = torch.load(out / f"{dev}.pt", weights_only=True)
        received += doc["bytes"]
        got = dict(doc["state"])
        assert set(got) == {(s.name, s.dim, s.start, s.stop) for s in ref.get(dev, {})}, dev
        for s, keys in ref.get(dev, {}).items():
            for k, t in keys.items():
                assert torch.equal(got[(s.name, s.dim, s.start, s.stop)][k], t), (dev, s.name, k)
    assert received > 0
