"""Elastic runs on this machine: each simulated node is its own torch elastic agent process.

:func:`run_elastic` (the launcher behind ``arachne run --elastic --simulate-devices``) hosts the job's
TCP store on 127.0.0.1, which serves both torch's c10d rendezvous and the job's own keys
(:mod:`arachne.runtime.elastic`), and starts one agent per node: ``python -m
arachne.runtime.elastic_agent``, in its own session. An agent registers its node as a candidate and
waits to be admitted (the launcher admits the first nodes together; later ones are admitted by the
job at a step boundary, when taking them pays); it then runs ``torch.distributed.launcher.api.
elastic_launch`` with ``rdzv_backend="c10d"``, ``min_nodes:max_nodes`` and ``max_restarts``, one worker
process per GPU of the node (gloo on CPU). A node leaving is a SIGKILL of its agent's process group
(:meth:`ElasticJob.kill`); a node joining, a new agent (:meth:`ElasticJob.add`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arachne.plan import Plan
from arachne.runtime import checkpoint as ckpt
from arachne.runtime.launch import JobError, free_port
from arachne.runtime.signals import raise_if_stopped, stop_on_signals
from arachne.spec.cluster import Cluster
from arachne.spec.model import ModelSpec

END_GRACE_S = 15.0  # after the last step, how long agents may take to exit before they are stopped
RDZV = {"is_host": False, "join_timeout": 120, "last_call_timeout": 2, "close_timeout": 5,
        "keep_alive_interval": 1, "keep_alive_max_attempt": 3}


@dataclass
class ElasticConfig:
    """How to run an elastic job on simulated nodes."""

    steps: int = 10
    """Steps to train (after a resume: on top of the checkpoint's)."""
    checkpoint_dir: Path = Path("checkpoints")  # type: ignore[assignment]
    """Where the job's checkpoints go (required: every restart restores from it)."""
    checkpoint_every: int = 1
    """Save a complete checkpoint every this many steps (and at the last step)."""
    horizon_steps: int = 1000
    """A join is taken only when its re-plan pays back within this many steps (or the steps left)."""
    min_nodes: int = 1
    """Fewest nodes the rendezvous runs with."""
    max_nodes: int | None = None
    """Most nodes the rendezvous admits (default: the cluster's)."""
    initial_nodes: list[str] | None = None
    """Nodes started at once (default: every node of the cluster)."""
    max_restarts: int = 10
    """Worker-group restarts each agent allows after failures."""
    seed: int = 0
    """Seed of the initial weights and the synthetic data."""
    lr: float = 1e-3
    """Learning rate."""
    timeout_s: float = 30.0
    """Seconds a collective may wait before failing (also how long a frozen peer goes unnoticed)."""
    plan_budget_s: float = 0.3
    """Planner search budget per re-plan."""
    min_step_s: float = 0.0
    """Each step lasts at least this long (simulated devices slower than this machine's CPU)."""
    job_timeout_s: float = 600.0
    """Give up (stop everything) after this long."""


@dataclass
class ElasticResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


class ElasticJob:
    """The launcher's handle on a running elastic job: its store and its agents."""

    def __init__(self, store: Any, port: int, cfg: ElasticConfig, cluster: Cluster, run_id: str, logs: Path):
        self.store, self.port, self.cfg, self.cluster, self.run_id, self.logs = store, port, cfg, cluster, run_id, logs
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()

    def add(self, node: str) -> None:
        """Start an agent for ``node`` (a node of the cluster file); it asks to join."""
        spec = self.cluster.node_by_name[node]
        cmd = [sys.executable, "-m", "arachne.runtime.elastic_agent", "--port", str(self.port), "--node", node,
               "--nproc", str(spec.num_gpus), "--min-nodes", str(self.cfg.min_nodes),
               "--max-nodes", str(self.cfg.max_nodes or len(self.cluster.nodes)), "--run-id", self.run_id,
               "--max-restarts", str(self.cfg.max_restarts)]
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE: each round's rank-0 agent hosts that round's worker store; a shared
        # one is cached from the first round and unreachable once its host node has left
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "LOGLEVEL": os.environ.get("ARACHNE_ELASTIC_LOGLEVEL", "WARNING"),
               "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "ARACHNE_ELASTIC_TORCH_LOGS": str(self.logs / f"{node}-torch")}
        with open(self.logs / f"{node}.log", "ab") as log:
            self.agents[node] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                                 env=env)

    def kill(self, node: str) -> None:
        """The node leaves: SIGKILL its agent and every process it started (its process group)."""
        p = self.agents[node]
        self.store.set("arachne/fault_t", json.dumps(time.time()))
        self.killed.add(node)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def stop_all(self) -> None:
        for p in self.agents.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + 5
        for p in self.agents.values():
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.agents.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)  # also any worker its agent left
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()

    def log_tail(self, node: str, chars: int = 1500) -> str:
        path = self.logs / f"{node}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def _get(store: Any, key: str) -> Any:
    return json.loads(store.get("arachne/" + key))


def run_elastic(plan: Plan, model: ModelSpec, cluster: Cluster, cfg: ElasticConfig,
                on_record: Callable[[dict[str, Any], ElasticJob], None] | None = None) -> ElasticResult:
    """Run ``plan``'s job elastically on simulated nodes of ``cluster`` until ``cfg.steps`` more steps are done.

    ``on_record`` sees every step and event document as it arrives, with the job's handle (a test can
    :meth:`ElasticJob.kill` a node or :meth:`ElasticJob.add` one from it)."""
    import torch.distributed as dist

    cluster_doc = cluster.to_spec()
    root = cfg.checkpoint_dir
    result = ElasticResult()
    keep = os.environ.get("ARACHNE_ELASTIC_LOGS")  # keep the agents' logs there (debugging)
    with stop_on_signals(), ckpt.locked(root), tempfile.TemporaryDirectory(prefix="arachne-elastic-") as tmp:
        logs = keep or tmp
        Path(logs).mkdir(parents=True, exist_ok=True)
        latest = ckpt.latest(root)
        start = int(ckpt.read_meta(latest)["step"]) if latest is not None else 0
        port = free_port()
        store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60))
        job_cfg = {"plan": plan.to_doc(), "model": model.model_dump(), "cluster": cluster_doc, "seed": cfg.seed,
                   "lr": cfg.lr, "timeout_s": cfg.timeout_s, "checkpoint_dir": str(root.resolve()),
                   "checkpoint_every": cfg.checkpoint_every, "horizon_steps": cfg.horizon_steps,
                   "total_steps": start + cfg.steps, "plan_budget_s": cfg.plan_budget_s,
                   "min_step_s": cfg.min_step_s, "store_host": "127.0.0.1", "store_port": port}
        store.set("arachne/cfg", json.dumps(job_cfg))
        job = ElasticJob(store, port, cfg, cluster, f"arachne-{port}", Path(logs))
        t0 = time.time()
        try:
            initial = cfg.initial_nodes or [n.name for n in cluster.nodes]
            for node in initial:
                job.add(node)
            _admit(job, initial, t0)
            _follow(job, result, on_record, t0)
        finally:
            job.stop_all()
        result.summary = summarize(result, start, time.time() - t0)
    return result


def _admit(job: ElasticJob, nodes: list[str], t0: float) -> None:
    """Admit the first nodes together once every one has asked (so that one rendezvous round holds them)."""
    while not all(job.store.check([f"arachne/cand_t/{n}"]) for n in nodes):
        raise_if_stopped()
        _check_agents(job)
        if time.time() - t0 > job.cfg.job_timeout_s:
            raise JobError("the agents did not start in time")
        time.sleep(0.05)
    for n in nodes:
        job.store.set(f"arachne/admit/{n}", "1")


def _check_agents(job: ElasticJob) -> None:
    for node, p in job.agents.items():
        code = p.poll()
        if code not in (None, 0) and node not in job.killed:
            raise JobError(f"the agent of node {node} exited with code {code}: {job.log_tail(node)}")


def _follow(job: ElasticJob, result: ElasticResult, on_record: Callable[[dict[str, Any], ElasticJob], None] | None,
            t0: float) -> None:
    """Print the job's documents in order until every agent has exited."""
    store, nxt = job.store, 1
    done_t: float | None = None
    while True:
        raise_if_stopped()
        while store.check([f"arachne/log/{nxt}"]):
            doc = _get(store, f"log/{nxt}")
            nxt += 1
            (result.events if "event" in doc else result.records).append(doc)
            if on_record is not None:
                on_record(doc, job)
        if store.check(["arachne/failed"]):
            raise JobError(f"the elastic job failed: {_get(store, 'failed')}")
        _check_agents(job)
        live = [p for n, p in job.agents.items() if n not in job.killed and p.poll() is None]
        if store.check(["arachne/done"]) and not store.check([f"arachne/log/{nxt}"]):
            done_t = done_t or time.time()
            if not live or time.time() - done_t > END_GRACE_S:
                return  # an agent still waiting at torch's exit barrier for a dead peer is stopped
        if not live:
            raise JobError("every agent exited before the last step")
        if time.time() - t0 > job.cfg.job_timeout_s:
            raise JobError(f"the elastic job did not finish within {job.cfg.job_timeout_s:.0f} s")
        time.sleep(0.05)


def summarize(result: ElasticResult, start: int, wall_s: float) -> dict[str, Any]:
    """Steps lost to faults (trained, then trained again after a restore), downtime, goodput."""
    steps = [r["step"] for r in result.records]
    lost = len(steps) - len(set(steps))
    restarts = [e for e in result.events if e["event"] != "start" and e.get("resumed_from_step") is not None]
    downtime = sum((e.get("detect_s") or 0.0) + e["plan_s"] + e.get("restore_s", 0.0) for e in restarts)
    final: dict[int, float] = {r["step"]: r["time_s"] for r in result.records}
    useful = sum(final.values())
    return {"summary": True, "steps": len(final), "first_step": start, "steps_lost": lost,
            "events": len(result.events), "downtime_s": downtime, "wall_s": wall_s,
            "goodput": useful / wall_s if wall_s > 0 else None,
            "step_goodput": len(final) / len(steps) if steps else None}


def run_from_cli(plan: Plan, model: ModelSpec, cluster: Cluster, cfg: ElasticConfig, simulate_devices: bool,
                 as_json: bool) -> None:
    """``arachne run --elastic``: check the flags, run, print every document (and the summary)."""
    from arachne.cli.common import console, fail
    from arachne.errors import InputError

    if not simulate_devices:
        raise InputError("", "--elastic", "runs simulated nodes on this machine only (not yet on a real "
                                          "cluster): add --simulate-devices")
    if cfg.checkpoint_dir is None:
        raise InputError("", "--checkpoint-dir", "--elastic restores every restart from it: give one")
    nodes = len(cluster.nodes)
    if cfg.min_nodes > (cfg.max_nodes or nodes) or (cfg.max_nodes or 0) > nodes:
        raise InputError("", "--min-nodes", f"expected 1 <= --min-nodes <= --max-nodes <= {nodes} (the cluster's "
                                            f"nodes), got {cfg.min_nodes} and {cfg.max_nodes}")

    def show(doc: dict[str, Any], _job: ElasticJob) -> None:
        if as_json:
            print(json.dumps(doc), flush=True)
        elif "event" in doc:
            console.print(f"{doc['event']}: {doc['reason']} (detect {doc.get('detect_s') or 0:.2f} s, plan "
                          f"{doc['plan_s']:.2f} s, restore {doc.get('restore_s') or 0:.2f} s)", markup=False,
                          highlight=False, soft_wrap=True)
        else:
            console.print(f"step {doc['step']:>4}  loss {doc['loss']:.6f}  time {doc['time_s']:.4f} s  "
                          f"world {doc['world_size']}  plan {doc['plan_id']}", markup=False, highlight=False)

    try:
        res = run_elastic(plan, model, cluster, cfg, show)
    except JobError as exc:
        fail(str(exc), 1)
        return
    if as_json:
        print(json.dumps(res.summary), flush=True)
    else:
        s = res.summary
        console.print(f"{s['steps']} steps, {s['steps_lost']} lost to faults, downtime {s['downtime_s']:.1f} s, "
                      f"goodput {s['goodput']:.2f}", markup=False, highlight=False)


# ---- the agent process --------------------------------------------------------------------------

def agent_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arachne.runtime.elastic_agent", description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--min-nodes", type=int, required=True)
    ap.add_argument("--max-nodes", type=int, required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--max-restarts", type=int, default=10)
    a = ap.parse_args(argv)

    import torch._dynamo  # noqa: F401 - torch's log formatter imports it on the first worker failure (seconds)
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from arachne.runtime.elastic import ALIVE_EVERY_S, worker_entry

    store = dist.TCPStore("127.0.0.1", a.port, is_master=False, timeout=datetime.timedelta(seconds=60))
    store.set(f"arachne/cand_t/{a.node}", json.dumps(time.time()))
    i = store.add("arachne/cand/n", 1)
    store.set(f"arachne/cand/{i}", json.dumps(a.node))
    def heartbeat() -> None:
        beat = dist.TCPStore("127.0.0.1", a.port, is_master=False, timeout=datetime.timedelta(seconds=60))
        while True:
            beat.set(f"arachne/alive/{a.node}", json.dumps(time.time()))
            time.sleep(ALIVE_EVERY_S)

    threading.Thread(target=heartbeat, name="arachne-alive", daemon=True).start()
    while not store.check([f"arachne/admit/{a.node}"]):  # wait to be let in (or for the end: left idle)
        if store.check(["arachne/done"]) or store.check(["arachne/failed"]):
            return 0
        time.sleep(0.05)
    config = LaunchConfig(min_nodes=a.min_nodes, max_nodes=a.max_nodes, nproc_per_node=a.nproc, run_id=a.run_id,
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{a.port}", rdzv_configs=dict(RDZV),
                          max_restarts=a.max_restarts, monitor_interval=0.1, start_method="fork",
                          local_addr="127.0.0.1",  # torch's per-agent log files go where the launcher cleans up
                          logs_specs=DefaultLogsSpecs(log_dir=os.environ.get("ARACHNE_ELASTIC_TORCH_LOGS")))
    elastic_launch(config, worker_entry)("127.0.0.1", a.port, a.node)
    return 0


if __name__ == "__main__":
    sys.exit(agent_main())
