"""The elastic training loop of one worker process, started by a torch elastic agent on every (re)start.

Each (re)start of the workers (a new rendezvous round of ``torch.distributed.elastic``) runs:

1. membership: every worker joins the round's process group (``env://``, set up by the agent) and
   all-gathers its device (``node:local_rank``); the nodes present become a cluster document (the
   job's cluster file restricted to them);
2. plan (rank 0): a join the job already decided to take (at a step boundary) brings its plan; any
   other change is re-planned with :func:`arachne.dynamic.replan.replan` (the previous plan when it
   still runs and nothing is faster); rank 0 broadcasts the plan and the event it reports;
3. restore: the newest complete checkpoint, re-sharded onto the plan, either moved from the node-local
   copies of the round's members over the round's group (``migrate``, :mod:`arachne.runtime.state_move`)
   or loaded from the checkpoint's files (``reload``), whichever is estimated cheaper and possible; the
   plan's devices then form a new process group; devices the plan does not use stay idle until the end;
4. train until the last step or a membership change: a worker's death fails the round's collectives
   (the agent restarts its workers; the others follow at the next rendezvous); a new node asking to
   join is judged at the next step boundary (:func:`judge_join`): taken (checkpoint, admit it, wait
   for the restart) or left idle.

Coordination goes through the job's TCP store (hosted by the launching process,
:mod:`arachne.runtime.elastic_agent`); every key lives under ``arachne/``. Rank 0 of the plan writes
one JSON document per step and per event to the store (``log/N``), which the launcher prints.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from arachne.dynamic.replan import replan
from arachne.errors import NoFeasiblePlanError
from arachne.plan import Plan, plan_from_dict
from arachne.planners.protocol import SearchBudget
from arachne.runtime import checkpoint as ckpt
from arachne.runtime import state_move
from arachne.runtime.engine import Worker, WorkerConfig, one_line
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.model import ModelSpec

PREFIX = "arachne/"
JOIN_WAIT_S = 120.0  # how long workers that admitted a node wait for the agents to restart them
DEFAULT_RESTART_S = 5.0  # restart downtime assumed for a join before any event was measured
ALIVE_EVERY_S = 0.25  # each agent refreshes ``alive/NODE`` this often
ALIVE_STALE_S = 2.0  # a member whose agent is silent this long has left (checked at step boundaries)


def plan_id(doc: dict[str, Any]) -> str:
    """A short, stable name of a plan document."""
    return hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:8]


class Store:
    """The job's key-value store (a TCPStore client), every key under :data:`PREFIX`."""

    def __init__(self, host: str, port: int, timeout_s: float = 60.0):
        self.raw = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))

    def set(self, key: str, value: Any) -> None:
        self.raw.set(PREFIX + key, json.dumps(value))

    def get(self, key: str, default: Any = None) -> Any:
        if not self.raw.check([PREFIX + key]):
            return default
        return json.loads(self.raw.get(PREFIX + key))

    def has(self, key: str) -> bool:
        return bool(self.raw.check([PREFIX + key]))

    def add(self, key: str, n: int) -> int:
        return int(self.raw.add(PREFIX + key, n))

    def delete(self, key: str) -> None:
        self.raw.delete_key(PREFIX + key)

    def emit(self, doc: dict[str, Any]) -> None:
        """Append one output document (the launcher prints them in order)."""
        i = self.add("log/n", 1)
        self.set(f"log/{i}", doc)


def round_cluster(job_cluster: dict[str, Any], members: list[str]) -> Cluster:
    """The job's cluster document restricted to the nodes in ``members`` (device names)."""
    nodes = {d.split(":")[0] for d in members}
    doc = dict(job_cluster)
    doc["nodes"] = [n for n in job_cluster["nodes"] if n["name"] in nodes]
    return cluster_from_dict(doc, "elastic membership")


def _replan(old: Plan, cluster: Cluster, model: ModelSpec, budget_s: float) -> Any:
    return replan(old, cluster, SearchBudget(time_budget_s=budget_s), model=model)


def state_survives(old: Plan, lost: list[str]) -> bool:
    """Whether every layer (and the embedding and head) of ``old`` is still whole on devices that did not
    leave: some stage holding it keeps a dp group with none of ``lost`` (only then can state move directly)."""
    gone = set(lost)
    kept: set[str] = set()
    for pipe in old.pipelines:
        last = len(pipe.stages) - 1
        for si, st in enumerate(pipe.stages):
            if any(not (set(g) & gone) for g in st.groups()):
                kept |= {str(i) for i in range(st.start, st.end)} | ({"emb"} if si == 0 else set()) | \
                    ({"head"} if si == last else set())
    need = {str(i) for i in range(old.pipelines[0].stages[-1].end)} | {"emb", "head"}
    return need <= kept


def restore_costs(res: Any, store: Store, survives: bool = True) -> dict[str, Any]:
    """Move state directly (the migration model's estimate; possible only when the state survives) or
    reload it from the checkpoint (its bytes at the rate measured by the last save): the cheaper is chosen."""
    migrate_s = float(res.migration.seconds) if survives else None
    rate = store.get("state/ckpt_rate")  # bytes/s of the last save
    size = store.get("state/ckpt_bytes")
    reload_s = float(size) / float(rate) if size and rate else None
    if migrate_s is None:
        choice, why = "reload", "state lost: some layer was held only on devices that left"
    elif reload_s is None or migrate_s < reload_s:
        choice, why = "migrate", "moving state is estimated faster"
    else:
        choice, why = "reload", "reloading is estimated faster"
    return {"restore": choice, "restore_reason": why, "migrate_s_est": migrate_s, "reload_s_est": reload_s}


def exact_restore(costs: dict[str, Any], doc: dict[str, Any], model: ModelSpec,
                  holders: list[tuple[str, list[state_move.Held]]], step: int | None) -> dict[str, Any]:
    """The restore choice made exact for the step restored: ``migrate`` (with its moves) only when every
    piece the plan ``doc`` needs of step ``step`` is held by a member of the round, else a reload."""
    if step is None:
        return {**costs, "restore": "none", "restore_reason": "no complete checkpoint: training restarts at step 0"}
    if costs["restore"] != "migrate":
        return costs
    t0 = time.perf_counter()
    plan = plan_from_dict(doc, "plan")
    moves, why = state_move.plan_moves(holders, plan, model, state_move.state_keys(plan, step))
    if moves is None:
        return {**costs, "restore": "reload", "restore_reason": f"cannot move step {step}: {why}"}
    return {**costs, "moves": moves, "move_plan_s": time.perf_counter() - t0}


def judge_join(store: Store, cfg: dict[str, Any], plan: Plan, members: list[str], node: str,
               step: int) -> dict[str, Any]:
    """Whether taking ``node`` in at this step boundary pays within the horizon: the re-plan's time saved
    per step against the restart's cost (the state transfer plus the last measured event downtime)."""
    model = ModelSpec(**cfg["model"])
    spec = next(n for n in cfg["cluster"]["nodes"] if n["name"] == node)
    devices = members + [f"{node}:{i}" for i in range(int(spec.get("gpus_per_node") or 1))]
    t0 = time.perf_counter()
    res = _replan(plan, round_cluster(cfg["cluster"], devices), model, cfg["plan_budget_s"])
    plan_s = time.perf_counter() - t0
    left = cfg["horizon_steps"]  # the user's horizon: how many more steps the job is expected to run
    costs = restore_costs(res, store)
    restart_s = float(store.get("state/last_downtime_s", DEFAULT_RESTART_S))
    move_s = min((x for x in (costs["migrate_s_est"], costs["reload_s_est"]) if x is not None), default=0.0)
    old_t = res.old_estimate.iteration_time_s if res.old_estimate else None
    saved = (old_t - res.estimate.iteration_time_s) if old_t is not None else None
    break_even = (move_s + restart_s) / saved if saved and saved > 0 and not res.kept_old else None
    take = break_even is not None and break_even <= left
    if res.kept_old:
        reason = f"join of {node}: no plan on the larger cluster is faster; {node} stays idle"
    elif take:
        reason = f"join of {node}: pays after {break_even:.3g} steps, within the horizon of {left}"
    else:
        why = f"pays only after {break_even:.3g} steps" if break_even is not None else "saves no time"
        reason = f"join of {node}: {why}, beyond the horizon of {left} steps; {node} stays idle"
    return {"take": take, "node": node, "plan": res.plan.to_doc(), "plan_s": plan_s, "reason": reason,
            "joined": [d for d in devices if d not in members], "break_even_steps": break_even,
            "old_tokens_per_s": res.old_estimate.tokens_per_s if res.old_estimate else None,
            "new_tokens_per_s": res.estimate.tokens_per_s, "devices": devices, **costs}


def _event(kind: str, reason: str, **fields: Any) -> dict[str, Any]:
    return {"event": kind, "reason": reason, **fields}


def decide_round(store: Store, cfg: dict[str, Any], members: list[str], t_known: float, t_started: float,
                 holders: list[tuple[str, list[state_move.Held]]] | None = None,
                 step: int | None = None) -> dict[str, Any]:
    """Rank 0 at the start of a round: the plan for ``members`` and the event to report. ``t_started``: when
    this worker process started (the rendezvous round was complete), ``t_known``: when the membership was;
    ``holders``: per rank of the round, its device and what its node-local copy of ``step`` holds."""
    model = ModelSpec(**cfg["model"])
    before: list[str] | None = store.get("state/members")
    old_doc = store.get("state/plan", cfg["plan"])
    lost = [d for d in (before or []) if d not in members]
    joined = [d for d in members if before is not None and d not in before]
    t_fault = max(store.get("state/progress_t", 0.0), store.get("fault_t", 0.0))
    pending = store.get("state/pending")
    detect_s = max(0.0, t_known - t_fault) if before is not None else None
    ev: dict[str, Any]
    if pending is not None and sorted(pending["devices"]) == sorted(members):
        t_fault = pending["t"]
        store.delete("state/pending")
        doc = pending["plan"]
        ev = _event("replan", pending["reason"], lost=lost, joined=joined, plan_s=pending["plan_s"],
                    detect_s=max(0.0, t_known - t_fault), old_tokens_per_s=pending["old_tokens_per_s"],
                    new_tokens_per_s=pending["new_tokens_per_s"], break_even_steps=pending["break_even_steps"],
                    **exact_restore({k: pending[k] for k in ("restore", "restore_reason", "migrate_s_est",
                                                             "reload_s_est")}, doc, model, holders or [], step))
    else:
        if pending is not None:
            store.delete("state/pending")
        t0 = time.perf_counter()
        try:
            res = _replan(plan_from_dict(old_doc, "plan"), round_cluster(cfg["cluster"], members), model,
                          cfg["plan_budget_s"])
        except NoFeasiblePlanError as exc:
            return {"error": f"no plan fits the remaining devices {members}: {one_line(exc)}"}
        plan_s = time.perf_counter() - t0
        doc = res.plan.to_doc()
        what = (f"lost {', '.join(lost)}" if lost else f"joined {', '.join(joined)}" if joined
                else "workers restarted after a failure")
        if before is None:
            kind, reason = "start", "first rendezvous"
            costs: dict[str, Any] = {"restore": "reload" if ckpt.latest(Path(cfg["checkpoint_dir"])) else "none",
                                     "restore_reason": None, "migrate_s_est": None, "reload_s_est": None}
        else:
            kind = "keep" if res.kept_old else "replan"
            reason = (f"{what}: the running plan still runs and nothing planned is faster" if res.kept_old
                      else f"{what}: " + (res.old_problem or "a faster plan"))
            costs = exact_restore(restore_costs(res, store, state_survives(plan_from_dict(old_doc, "plan"), lost)),
                                  doc, model, holders or [], step)
        ev = _event(kind, reason, lost=lost, joined=joined, plan_s=plan_s, detect_s=detect_s,
                    old_tokens_per_s=res.old_estimate.tokens_per_s if res.old_estimate else None,
                    new_tokens_per_s=res.estimate.tokens_per_s, **costs)
    store.set("state/members", members)
    store.set("state/plan", doc)
    ev["plan_id"] = plan_id(doc)
    ev["devices"] = list(plan_from_dict(doc, "plan").devices)
    ev["world_size"] = len(ev["devices"])
    ev["t_fault"] = t_fault
    if ev.get("detect_s") is not None:  # its parts: agents noticing and re-rendezvousing; workers starting
        ev["rendezvous_s"] = max(0.0, t_started - t_fault)
        ev["connect_s"] = t_known - t_started
    moves = ev.pop("moves", None)
    return {"plan": doc, "event": ev, "round": store.add("round", 1), "moves": moves, "step": step,
            "save_tag": uuid.uuid4().hex[:12]}


def worker_entry(host: str, port: int, node: str) -> None:
    """Entry point of every worker process (a function target of ``elastic_launch``).

    A failure (a peer gone, a member's agent silent) ends the process at once with exit code 1 and one
    line on stderr: the agent restarts its workers; a normal interpreter exit can take seconds here."""
    try:
        _worker(host, port, node, time.time())
    except BaseException as exc:  # noqa: BLE001 - every failure ends this round the same way
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        if code:
            sys.stderr.write(f"arachne elastic worker {node}:{os.environ.get('LOCAL_RANK')}: {one_line(exc)}\n")
            sys.stderr.flush()
            os._exit(code)


def _worker(host: str, port: int, node: str, t_started: float) -> None:
    store = Store(host, port)
    cfg = store.get("cfg")
    torch.set_num_threads(1)  # the agent chose GLOO_SOCKET_IFNAME (loopback for simulated nodes)
    timeout = datetime.timedelta(seconds=cfg["timeout_s"])
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    me = f"{node}:{int(os.environ['LOCAL_RANK'])}"
    local = state_move.open_local(Path(cfg["checkpoint_dir"]), me)  # what this device kept of the newest step
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (me, local.manifest))
    members = sorted(d for d, _ in gathered)
    box: list[Any] = [None]
    if rank == 0:
        box[0] = decide_round(store, cfg, members, time.time(), t_started, gathered, local.step)
        if "error" in box[0]:
            store.set("failed", box[0]["error"])
    dist.broadcast_object_list(box, 0)
    decision = box[0]
    t_decided = time.perf_counter()
    moved = None
    if "error" not in decision and decision["moves"] is not None:  # every member serves its pieces
        plan = plan_from_dict(decision["plan"], "plan")
        specs = state_move.targets(plan, ModelSpec(**cfg["model"])).get(me, [])
        moved = state_move.execute(decision["moves"], rank, local.flat, specs,
                                   state_move.state_keys(plan, decision["step"]))
    dist.destroy_process_group()
    if "error" in decision:
        raise SystemExit(3)
    plan = plan_from_dict(decision["plan"], "plan")
    if me not in plan.devices:
        _idle(store, members, decision["round"])
        return
    _train(store, cfg, plan, decision, me, members, moved, t_decided)


def _idle(store: Store, members: list[str], rnd: int) -> None:
    """A device the plan does not use: wait for the end of the job (or to be restarted); a member that
    left ends the round (when every trainer was on it, nobody else would notice)."""
    while not store.has("done") and not store.has("failed"):
        if (gone := _gone(store, members)) is not None:
            raise RuntimeError(f"node {gone} left (its agent stopped answering)")
        _check_round(store, rnd)
        time.sleep(0.2)


def _check_round(store: Store, rnd: int) -> None:
    """A newer round started without this worker (the rendezvous took its agent for dead): rejoin."""
    if store.add("round", 0) > rnd:
        raise RuntimeError("a newer rendezvous round started without this node; rejoining")


_SEEN: dict[str, tuple[Any, float]] = {}  # node -> (its last ``alive`` value, when it changed on this clock)


def _gone(store: Store, members: list[str]) -> str | None:
    """A member node whose agent has not refreshed its ``alive`` key for :data:`ALIVE_STALE_S`, timed on this
    process's own clock from when the value last changed (the value is another machine's clock: never
    compared with this one, so clock skew between nodes cannot make a live node look gone)."""
    now = time.monotonic()
    for node in sorted({d.split(":")[0] for d in members}):
        beat = store.get(f"alive/{node}")
        if beat is None:
            continue
        seen = _SEEN.get(node)
        if seen is None or seen[0] != beat:
            _SEEN[node] = (beat, now)
        elif now - seen[1] > ALIVE_STALE_S:
            return node
    return None


def _train(store: Store, cfg: dict[str, Any], plan: Plan, decision: dict[str, Any], me: str, members: list[str],
           moved: tuple[dict[Any, Any], int] | None, t_decided: float) -> None:
    """Restore (``moved``: the state :func:`state_move.execute` gave this device, else the checkpoint's files)
    and train; ``t_decided``: when the decision arrived (the restore's start)."""
    order = list(plan.devices)
    rank = order.index(me)
    ev = decision["event"]
    root = Path(cfg["checkpoint_dir"])
    if rank == 0:
        ckpt.clear_partial(root)  # what a killed round left half-written (every old worker is gone)
    use_cuda = cfg.get("devices") == "auto" and torch.cuda.is_available()
    if use_cuda:  # a real node: each worker trains on its own GPU (the plan's device index on its node)
        torch.cuda.set_device(int(me.split(":")[1]) % torch.cuda.device_count())
    wcfg = WorkerConfig(plan=decision["plan"], model=cfg["model"], order=order, seed=cfg["seed"], lr=cfg["lr"],
                        timeout_s=cfg["timeout_s"], checkpoint_dir=str(root), backend="nccl" if use_cuda else "gloo",
                        cuda_index=[int(d.split(":")[1]) % torch.cuda.device_count() for d in order]
                        if use_cuda else None)
    latest = ckpt.latest(root)
    if latest is not None:
        meta = ckpt.read_meta(latest)
        wcfg.resume_from, wcfg.start_step, wcfg.start_sample = str(latest), int(meta["step"]), int(meta["samples"])
        wcfg.extra["losses"] = list(meta.get("losses", []))
        if moved is not None:  # the state arrived from the members: build from the seed, then overwrite
            if wcfg.start_step != decision["step"]:
                raise RuntimeError(f"moved step {decision['step']} but the newest checkpoint is {wcfg.start_step}")
            wcfg.resume_from = None
    prefix = dist.PrefixStore(f"{PREFIX}train/{decision['round']}", store.raw)
    dist.init_process_group(wcfg.backend, store=prefix, rank=rank, world_size=len(order),
                            timeout=datetime.timedelta(seconds=cfg["timeout_s"]))
    out: list[dict[str, Any]] = []
    w = Worker(rank, wcfg, out.append)
    w._setup_groups()
    w.build()
    got = torch.tensor([0.0], dtype=torch.float64, device=w.device)
    if moved is not None:
        state_move.apply_state(w, moved[0], wcfg.start_step)
        got[0] = moved[1]
    dist.all_reduce(got)
    restore_s = time.perf_counter() - t_decided + ev.pop("move_plan_s", 0.0)
    if rank == 0:
        ev.update(restore_s=restore_s, resumed_from_step=wcfg.start_step, moved_bytes=int(got[0]))
        t_fault = ev.pop("t_fault")
        if ev["event"] != "start":
            store.set("state/last_downtime_s", time.time() - t_fault)
        store.emit(ev)
    _loop(store, cfg, w, plan, members, decision["round"], decision["save_tag"])
    dist.barrier()
    dist.destroy_process_group()


def _loop(store: Store, cfg: dict[str, Any], w: Worker, plan: Plan, members: list[str], rnd: int, tag: str) -> None:
    wcfg, rank = w.cfg, w.rank
    saver = AsyncSaver(cfg["store_host"], cfg["store_port"], w, rnd, tag)
    world = len(wcfg.order)
    samples, step = wcfg.start_sample, wcfg.start_step
    losses: list[float] = list(wcfg.extra.get("losses", []))
    saved_at = step
    pid = plan_id(wcfg.plan)
    while step < cfg["total_steps"]:
        box: list[Any] = [None]
        if rank == 0:
            _check_round(store, rnd)
            box[0] = _boundary(store, cfg, plan, members, step)
        if world > 1:
            dist.broadcast_object_list(box, 0)
        if box[0] is not None and "gone" in box[0]:  # a member's agent died: restart for a new round
            raise RuntimeError(f"node {box[0]['gone']} left (its agent stopped answering)")
        if box[0] is not None and box[0]["take"]:
            if saved_at != step:
                saver.save(step, samples, losses)
            saver.wait()
            if rank == 0:
                store.set("state/pending", {**box[0], "t": time.time()})
                store.set(f"admit/{box[0]['node']}", 1)
            _await_restart(store, rnd)
            return
        t0 = time.perf_counter()
        loss_sum = w.step(samples)
        if (pace := cfg["min_step_s"] - (time.perf_counter() - t0)) > 0:  # simulated slower devices
            time.sleep(pace)
        total = torch.tensor([loss_sum, time.perf_counter() - t0], dtype=torch.float64, device=w.device)
        if world > 1:
            dt = total[1:].clone()
            dist.all_reduce(total[:1])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            total[1] = dt[0]
        loss = float(total[0]) / (plan.global_batch_size * plan.sequence_length)
        samples += plan.global_batch_size
        losses.append(loss)
        step += 1
        if rank == 0:
            store.emit({"step": step - 1, "loss": loss, "time_s": float(total[1]), "world_size": world,
                        "plan_id": pid})
            store.set("state/progress_t", time.time())
        if step % cfg["checkpoint_every"] == 0 or step == cfg["total_steps"]:
            saver.save(step, samples, losses)
            saved_at = step
    saver.wait()
    if world > 1:
        dist.barrier()  # every rank's save is complete (rank 0's assembled) before the job is done
    if rank == 0:
        store.set("done", 1)


class AsyncSaver:
    """Checkpoints written in the background: each rank copies what it holds (on the training thread), then a
    thread writes its share of the checkpoint and marks it done in the store; rank 0's thread waits for every
    rank's mark and assembles the step (published atomically, so a round killed meanwhile leaves the previous
    one latest). Each thread then keeps its rank's node-local copy (:func:`ckpt.save_local`) for a direct move.
    One save at a time: the next one, a join and the end of training wait for it (:meth:`wait`)."""

    def __init__(self, host: str, port: int, w: Worker, rnd: int, tag: str):
        self.host, self.port, self.w, self.rnd, self.tag = host, port, w, rnd, tag
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def save(self, step: int, samples: int, losses: list[float]) -> None:
        self.wait()
        w = self.w
        writes = set(w.layout.checkpoint_writers.get(w.rank, []))
        pieces: dict[str, list[dict[str, Any]]] = {}
        for spec, p in w.entries:
            piece: dict[str, Any] = {"dim": spec.dim, "start": spec.start, "stop": spec.stop,
                                     "writer": spec in writes, "param": p.detach().cpu().clone()}
            st = w.opt.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st:
                    piece[key] = st[key].detach().cpu().clone()
            pieces.setdefault(spec.name, []).append(piece)
        meta = {"format": ckpt.CHECKPOINT_FORMAT, "step": step, "samples": samples, "seed": w.cfg.seed,
                "lr": w.cfg.lr, "optimizer": w.plan.optimizer, "model": w.cfg.model, "plan": w.cfg.plan,
                "losses": list(losses), "save_id": f"{self.tag}-{step}"}
        self.thread = threading.Thread(target=self._write, args=(step, pieces, meta), name="arachne-ckpt",
                                       daemon=True)
        self.thread.start()

    def _write(self, step: int, pieces: dict[str, list[dict[str, Any]]], meta: dict[str, Any]) -> None:
        try:
            w, root = self.w, Path(self.w.cfg.checkpoint_dir or ".")
            store = Store(self.host, self.port, self.w.cfg.timeout_s)  # its own connection
            t0 = time.perf_counter()
            shared = {n: kept for n, ps in pieces.items() if (kept := [p for p in ps if p["writer"]])}
            if shared:
                ckpt.save_pieces(root, step, w.rank, shared)
            store.set(f"ckpt/{self.rnd}/{step}/{w.rank}", 1)
            if w.rank == 0:
                keys = [f"{PREFIX}ckpt/{self.rnd}/{step}/{r}" for r in range(w.layout.world_size)]
                store.raw.wait(keys, datetime.timedelta(seconds=w.cfg.timeout_s))
                shapes = {name: hs[0][1].shape for name, hs in w.layout.holders.items()}
                path = ckpt.assemble(root, step, shapes, meta)
                size = sum(f.stat().st_size for f in path.glob("*.pt"))
                store.set("state/ckpt_bytes", size)
                store.set("state/ckpt_rate", size / max(1e-6, time.perf_counter() - t0))
            me = w.cfg.order[w.rank]
            ckpt.save_local(root, me, step, meta["save_id"], pieces)
            if (done := ckpt.latest(root)) is not None:
                ckpt.prune_local(root, me, int(ckpt.read_meta(done)["step"]))
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            self.error = exc

    def wait(self) -> None:
        """Wait for the save in flight; raise what it failed with."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            raise RuntimeError(f"checkpoint save failed: {one_line(self.error)}")


def _boundary(store: Store, cfg: dict[str, Any], plan: Plan, members: list[str],
              step: int) -> dict[str, Any] | None:
    """Rank 0 at a step boundary: a member gone, or the first node asking to join not judged yet."""
    if (gone := _gone(store, members)) is not None:
        return {"take": False, "gone": gone}
    nodes = {d.split(":")[0] for d in members}
    for i in range(1, store.add("cand/n", 0) + 1):
        node = store.get(f"cand/{i}")
        if node is None or node in nodes or store.has(f"admit/{node}") or store.has(f"declined/{node}"):
            continue
        verdict = judge_join(store, cfg, plan, members, node, step)
        if verdict["take"]:
            return verdict
        store.set(f"declined/{node}", 1)
        store.emit({"event": "keep", "reason": verdict["reason"], "lost": [], "joined": verdict["joined"],
                    "detect_s": time.time() - store.get(f"cand_t/{node}", time.time()),
                    "plan_s": verdict["plan_s"], "restore_s": 0.0, "resumed_from_step": None,
                    "old_tokens_per_s": verdict["old_tokens_per_s"], "new_tokens_per_s": verdict["new_tokens_per_s"],
                    "break_even_steps": verdict["break_even_steps"], "restore": verdict["restore"],
                    "restore_reason": verdict["restore_reason"],
                    "migrate_s_est": verdict["migrate_s_est"], "reload_s_est": verdict["reload_s_est"],
                    "plan_id": plan_id(plan.to_doc()), "world_size": len(plan.devices),
                    "devices": list(plan.devices), "at_step": step})
    return None


def _await_restart(store: Store, rnd: int) -> None:
    """The job admitted a node: its agent joins the rendezvous and every agent restarts its workers."""
    end = time.monotonic() + JOIN_WAIT_S
    while time.monotonic() < end:
        if store.has("failed"):
            return
        _check_round(store, rnd)
        time.sleep(0.1)
    raise RuntimeError(f"the admitted node did not join within {JOIN_WAIT_S:.0f} s")
