"""Elastic runs: the job's store and its coordinator, and the torch elastic agent of every node.

Two launchers share one code path (:func:`_host_job`, :func:`_admit`, :func:`_follow`):

- :func:`run_elastic` (``arachne run --elastic --simulate-devices``) hosts the job's TCP store on 127.0.0.1
  and starts one agent per simulated node on this machine, each in its own session. A node leaving is a
  SIGKILL of its agent's process group (:meth:`ElasticJob.kill`); a node joining, a new agent
  (:meth:`ElasticJob.add`);
- :func:`coordinate` (``arachne run --elastic --store HOST:PORT``, the ``elastic_store.sh`` that
  ``arachne export --format torchrun --elastic`` writes) hosts the store on this machine for agents that
  each node starts itself (its ``launch_NODE.sh``); it sees them only through the store.

Both write the job's configuration (plan, model, cluster, steps, checkpoints, node counts, run id) to the
store (``arachne/cfg``), which serves both torch's c10d rendezvous and the job's own keys
(:mod:`arachne.runtime.elastic`); admit the first nodes together once each has asked; print every document
the workers report; and stop once the last step is done and the agents have exited.

An agent (:func:`run_agent`: ``python -m arachne.runtime.elastic_agent`` or ``arachne elastic-agent``, with
``--store HOST:PORT --node NODE``) reads everything else from the store: it registers its node as a
candidate and waits to be admitted (later nodes are admitted by the job at a step boundary, when taking
them pays); it then runs ``torch.distributed.launcher.api.elastic_launch`` with ``rdzv_backend="c10d"``,
``min_nodes:max_nodes`` and ``max_restarts``, one worker process per GPU of its node (gloo on CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arachne.errors import InputError, one_line
from arachne.plan import Plan
from arachne.runtime import checkpoint as ckpt
from arachne.runtime.elastic_export import (
    check_elastic_run,
    is_loopback,
    is_this_machine,
    parse_store,
    plan_nodes,
    route_interface,
    store_address,
    wait_for_port,
)
from arachne.runtime.launch import JobError, free_port
from arachne.runtime.signals import raise_if_stopped, stop_on_signals
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.model import ModelSpec

END_GRACE_S = 15.0  # after the last step, how long agents may take to exit before they are stopped
AGENT_STALE_S = 3.0  # an agent whose alive key is older than this has stopped (as the coordinator sees it)
RDZV = {"is_host": False, "join_timeout": 120, "last_call_timeout": 2, "close_timeout": 5,
        "keep_alive_interval": 1, "keep_alive_max_attempt": 3}


@dataclass
class ElasticConfig:
    """How to run an elastic job."""

    steps: int = 10
    """Steps to train (after a resume: on top of the checkpoint's)."""
    checkpoint_dir: Path = Path("checkpoints")  # type: ignore[assignment]
    """Where the job's checkpoints go (required: every restart restores from it; on a real cluster a
    directory every node sees at the same path)."""
    checkpoint_every: int = 1
    """Save a complete checkpoint every this many steps (and at the last step)."""
    horizon_steps: int = 1000
    """A join is taken only when its re-plan pays back within this many steps (or the steps left)."""
    min_nodes: int = 1
    """Fewest nodes the rendezvous runs with."""
    max_nodes: int | None = None
    """Most nodes the rendezvous admits (default: the cluster's)."""
    initial_nodes: list[str] | None = None
    """Nodes admitted together at the start (default: every node of the cluster when simulated, the plan's
    nodes with a store of its own)."""
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
    job_timeout_s: float | None = 600.0
    """Give up (stop everything) after this long; None: never."""


@dataclass
class ElasticResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


class ElasticJob:
    """The simulated launcher's handle on a running elastic job: its store and the agents it started."""

    def __init__(self, store: Any, port: int, cfg: ElasticConfig, cluster: Cluster, run_id: str, logs: Path):
        self.store, self.port, self.cfg, self.cluster, self.run_id, self.logs = store, port, cfg, cluster, run_id, logs
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: set[str] = set()

    def add(self, node: str) -> None:
        """Start an agent for ``node`` (a node of the cluster file); it asks to join."""
        if node not in self.cluster.node_by_name:
            raise KeyError(f"{node!r} is not a node of the cluster")
        cmd = [sys.executable, "-m", "arachne.runtime.elastic_agent", "--store", f"127.0.0.1:{self.port}",
               "--node", node]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
               "LOGLEVEL": os.environ.get("ARACHNE_ELASTIC_LOGLEVEL", "WARNING"),
               "ARACHNE_ELASTIC_TORCH_LOGS": str(self.logs / f"{node}-torch")}
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

    def check(self) -> None:
        """:class:`JobError` when an agent not killed on purpose exited with an error."""
        for node, p in self.agents.items():
            code = p.poll()
            if code not in (None, 0) and node not in self.killed:
                raise JobError(f"the agent of node {node} exited with code {code}: {self.log_tail(node)}")

    def live(self) -> bool:
        return any(n not in self.killed and p.poll() is None for n, p in self.agents.items())


class StoreAgents:
    """The coordinator's view of agents it did not start: their keys in the store."""

    def __init__(self, store: Any):
        self.store = store
        self.beats: dict[str, tuple[bytes, float]] = {}  # per node: its last alive value, when it last changed


    def nodes(self) -> list[str]:
        n = int(self.store.add("arachne/cand/n", 0))
        return [json.loads(self.store.get(f"arachne/cand/{i}")) for i in range(1, n + 1)
                if self.store.check([f"arachne/cand/{i}"])]

    def check(self) -> None:
        for node in self.nodes():
            if self.store.check([f"arachne/agent_error/{node}"]):
                why = json.loads(self.store.get(f"arachne/agent_error/{node}"))
                raise JobError(f"the agent of node {node} failed: {why}")

    def live(self) -> bool:
        """Whether an agent that asked to join still runs: it has not exited and its ``alive`` key changed
        within :data:`AGENT_STALE_S` (timed on this machine's clock: the nodes' clocks may differ)."""
        now, any_live = time.monotonic(), False
        for node in self.nodes():
            if self.store.check([f"arachne/exit/{node}"]) or not self.store.check([f"arachne/alive/{node}"]):
                continue
            beat = self.store.get(f"arachne/alive/{node}")
            if node not in self.beats or self.beats[node][0] != beat:
                self.beats[node] = (beat, now)
            any_live = any_live or now - self.beats[node][1] < AGENT_STALE_S
        return any_live


def _why(exc: BaseException) -> str:
    """``Type: first line of the message``, on one printable line."""
    lines = [x for x in str(exc).strip().splitlines() if x.strip()]
    return one_line(f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": "))


def _get(store: Any, key: str) -> Any:
    return json.loads(store.get("arachne/" + key))


@contextlib.contextmanager
def _host_job(plan: Plan, model: ModelSpec, cluster: Cluster, cfg: ElasticConfig, host: str,
              port: int, devices: str = "cpu") -> Iterator[tuple[Any, int, str]]:
    """Host the job's store on this machine at ``port`` (reached by the agents at ``host``), its
    configuration written: (store, the checkpoint's step the job starts from, run id). The checkpoint
    directory stays locked meanwhile. ``devices``: ``cpu`` (simulated nodes: gloo on CPU) or ``auto``
    (a real cluster: each worker trains on its CUDA device with nccl when it has one)."""
    import torch.distributed as dist

    root = cfg.checkpoint_dir
    with ckpt.locked(root):
        latest = ckpt.latest(root)
        start = int(ckpt.read_meta(latest)["step"]) if latest is not None else 0
        try:
            store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=60))
        except (RuntimeError, OSError) as exc:
            raise JobError(f"cannot host the job's store on port {port}: {_why(exc)}") from None
        run_id = f"arachne-{port}-{secrets.token_hex(4)}"
        if not is_loopback(host):
            _check_reaches(host, port)
        job_cfg = {"plan": plan.to_doc(), "model": model.model_dump(), "cluster": cluster.to_spec(),
                   "seed": cfg.seed, "lr": cfg.lr, "timeout_s": cfg.timeout_s, "checkpoint_dir": str(root.resolve()),
                   "checkpoint_every": cfg.checkpoint_every, "horizon_steps": cfg.horizon_steps,
                   "total_steps": start + cfg.steps, "plan_budget_s": cfg.plan_budget_s,
                   "min_step_s": cfg.min_step_s, "store_host": host, "store_port": port, "devices": devices,
                   "agent": {"min_nodes": cfg.min_nodes, "max_nodes": cfg.max_nodes or len(cluster.nodes),
                             "max_restarts": cfg.max_restarts, "run_id": run_id}}
        store.set("arachne/cfg", json.dumps(job_cfg))
        yield store, start, run_id


def _check_reaches(host: str, port: int) -> None:
    """The agents reach this store at ``host:port``: ``host`` is this machine, or a connection to ``host:port``
    (a forwarded address) gets through; else the command runs on the wrong host."""
    if not is_this_machine(host) and not wait_for_port(host, port, 10.0):
        raise InputError("", "--store", f"{store_address(host, port)} does not reach the store this command hosts "
                                        f"on port {port}: run it on that host")


def run_elastic(plan: Plan, model: ModelSpec, cluster: Cluster, cfg: ElasticConfig,
                on_record: Callable[[dict[str, Any], ElasticJob], None] | None = None) -> ElasticResult:
    """Run ``plan``'s job elastically on simulated nodes of ``cluster`` until ``cfg.steps`` more steps are done.

    ``on_record`` sees every step and event document as it arrives, with the job's handle (a test can
    :meth:`ElasticJob.kill` a node or :meth:`ElasticJob.add` one from it)."""
    result = ElasticResult()
    keep = os.environ.get("ARACHNE_ELASTIC_LOGS")  # keep the agents' logs there (debugging)
    with stop_on_signals(), tempfile.TemporaryDirectory(prefix="arachne-elastic-") as tmp:
        logs = keep or tmp
        Path(logs).mkdir(parents=True, exist_ok=True)
        port = free_port()
        with _host_job(plan, model, cluster, cfg, "127.0.0.1", port) as (store, start, run_id):
            job = ElasticJob(store, port, cfg, cluster, run_id, Path(logs))
            t0 = time.time()
            try:
                initial = cfg.initial_nodes or [n.name for n in cluster.nodes]
                for node in initial:
                    job.add(node)
                _admit(store, job, initial, cfg, t0)
                _follow(store, job, result, on_record, cfg, t0)
            finally:
                job.stop_all()
            result.summary = summarize(result, start, time.time() - t0)
    return result


def coordinate(plan: Plan, model: ModelSpec, cluster: Cluster, cfg: ElasticConfig, host: str, port: int,
               on_record: Callable[[dict[str, Any], StoreAgents], None] | None = None) -> ElasticResult:
    """Host ``plan``'s elastic job at ``host:port`` for agents started on each node (``arachne elastic-agent``):
    admit the first nodes (``cfg.initial_nodes``, default the plan's) once each has asked, report every
    document until the last step, then wait (at most :data:`END_GRACE_S`) for the agents to exit."""
    result = ElasticResult()
    with stop_on_signals(), _host_job(plan, model, cluster, cfg, host, port, "auto") as (store, start,
                                                                                         _run_id):
        agents = StoreAgents(store)
        t0 = time.time()
        try:
            _admit(store, agents, cfg.initial_nodes or plan_nodes(plan, cluster), cfg, t0)
            _follow(store, agents, result, on_record, cfg, t0)
        except BaseException as exc:  # tell waiting agents and idle workers that the job is over
            if not store.check(["arachne/failed"]):
                store.set("arachne/failed", json.dumps(f"the coordinator stopped: {_why(exc)}"))
            raise
        result.summary = summarize(result, start, time.time() - t0)
    return result


def _admit(store: Any, agents: ElasticJob | StoreAgents, nodes: list[str], cfg: ElasticConfig, t0: float) -> None:
    """Admit the first nodes together once every one has asked (so that one rendezvous round holds them)."""
    while not all(store.check([f"arachne/cand_t/{n}"]) for n in nodes):
        raise_if_stopped()
        agents.check()
        if cfg.job_timeout_s is not None and time.time() - t0 > cfg.job_timeout_s:
            raise JobError("the agents did not start in time")
        time.sleep(0.05)
    for n in nodes:
        store.set(f"arachne/admit/{n}", "1")


def _follow(store: Any, agents: Any, result: ElasticResult, on_record: Callable[[dict[str, Any], Any], None] | None,
            cfg: ElasticConfig, t0: float) -> None:
    """Report the job's documents in order until every agent has exited after the last step."""
    nxt = 1
    done_t: float | None = None
    while True:
        raise_if_stopped()
        while store.check([f"arachne/log/{nxt}"]):
            doc = _get(store, f"log/{nxt}")
            nxt += 1
            (result.events if "event" in doc else result.records).append(doc)
            if on_record is not None:
                on_record(doc, agents)
        if store.check(["arachne/failed"]):
            raise JobError(f"the elastic job failed: {_get(store, 'failed')}")
        agents.check()
        live = agents.live()
        if store.check(["arachne/done"]) and not store.check([f"arachne/log/{nxt}"]):
            done_t = done_t or time.time()
            if not live or time.time() - done_t > END_GRACE_S:
                return  # an agent still waiting at torch's exit barrier for a dead peer is stopped
        if not live and (isinstance(agents, ElasticJob) or store.check(["arachne/round"])):
            raise JobError("every agent exited before the last step")
        if cfg.job_timeout_s is not None and time.time() - t0 > cfg.job_timeout_s:
            raise JobError(f"the elastic job did not finish within {cfg.job_timeout_s:.0f} s")
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
                 as_json: bool, store: str | None = None) -> None:
    """``arachne run --elastic``: check the flags, run (simulated nodes, or the store of a real cluster's job),
    print every document (and the summary)."""
    from arachne.cli.common import console, fail

    address = check_elastic_run(cluster, simulate_devices, store, cfg.checkpoint_dir, cfg.min_nodes, cfg.max_nodes)

    def show(doc: dict[str, Any], _job: Any) -> None:
        if as_json:
            print(json.dumps(doc), flush=True)
        elif "event" in doc:
            console.print(f"{doc['event']}: {doc['reason']} (detect {doc.get('detect_s') or 0:.2f} s, plan "
                          f"{doc['plan_s']:.2f} s, restore {doc.get('restore_s') or 0:.2f} s"
                          + (f" by {doc['restore']}" if doc.get("restore") else "") + ")", markup=False,
                          highlight=False, soft_wrap=True)
        else:
            console.print(f"step {doc['step']:>4}  loss {doc['loss']:.6f}  time {doc['time_s']:.4f} s  "
                          f"world {doc['world_size']}  plan {doc['plan_id']}", markup=False, highlight=False)

    try:
        if address is not None:
            cfg.job_timeout_s = None  # a real job runs as long as it takes; the agents start when they start
            res = coordinate(plan, model, cluster, cfg, address[0], address[1], show)
        else:
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

def run_agent(store: str, node: str, local_addr: str | None = None, connect_timeout_s: float = 600.0) -> int:
    """Run ``node``'s elastic agent for the job whose store is at ``store`` (``HOST:PORT``) until the job ends.

    The job's configuration (its cluster, hence this node's GPUs; node counts; run id) comes from the store,
    which the coordinator filled from its files and flags. With a loopback store every agent runs on this
    machine (``local_addr`` 127.0.0.1, gloo on ``lo``); otherwise gloo uses the interface the store is
    reached through unless ``GLOO_SOCKET_IFNAME`` says otherwise."""
    host, port = parse_store(store)
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from arachne.runtime.elastic import ALIVE_EVERY_S, worker_entry

    # each round's rank-0 agent hosts that round's worker store; a shared one is cached from the first round
    # and unreachable once its host node has left
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    os.environ.setdefault("LOGLEVEL", "WARNING")
    if is_loopback(host):
        local_addr = local_addr or "127.0.0.1"
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    elif "GLOO_SOCKET_IFNAME" not in os.environ and (iface := route_interface(host, port)) is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    wait = datetime.timedelta(seconds=connect_timeout_s)
    if not wait_for_port(host, port, connect_timeout_s):  # quietly: torch's client logs every failed try
        raise JobError(f"cannot reach the job's store at {store_address(host, port)} within {connect_timeout_s:g} s")
    try:
        client = dist.TCPStore(host, port, is_master=False, timeout=wait)
        client.wait(["arachne/cfg"], wait)
        cfg = json.loads(client.get("arachne/cfg"))
    except (RuntimeError, OSError) as exc:
        raise JobError(f"cannot reach the job's store at {store_address(host, port)}: {_why(exc)}") from None
    cluster = cluster_from_dict(cfg["cluster"], "the job's cluster")
    if node not in cluster.node_by_name:
        names = ", ".join(list(cluster.node_by_name)[:8])
        raise InputError("", "--node", f"{node!r} is not a node of the job's cluster ({names})")
    ag = cfg["agent"]
    import torch._dynamo  # noqa: F401 - torch's log formatter imports it on the first worker failure (seconds)

    def heartbeat() -> None:
        with contextlib.suppress(Exception):  # the store gone: the main thread reports it
            beat = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=60))
            while True:
                beat.set(f"arachne/alive/{node}", json.dumps(time.time()))
                time.sleep(ALIVE_EVERY_S)

    try:
        try:
            for key in ("admit", "declined", "exit", "agent_error"):  # what an earlier agent of this node left
                client.delete_key(f"arachne/{key}/{node}")
            client.set(f"arachne/alive/{node}", json.dumps(time.time()))
            threading.Thread(target=heartbeat, name="arachne-alive", daemon=True).start()
            client.set(f"arachne/cand_t/{node}", json.dumps(time.time()))
            i = client.add("arachne/cand/n", 1)
            client.set(f"arachne/cand/{i}", json.dumps(node))
            while not client.check([f"arachne/admit/{node}"]):  # wait to be let in (or for the end: left idle)
                if client.check(["arachne/done"]) or client.check(["arachne/failed"]):
                    return 0
                time.sleep(0.05)
        except (RuntimeError, OSError) as exc:
            raise JobError(f"lost the job's store at {store_address(host, port)}: {_why(exc)}") from None
        config = LaunchConfig(min_nodes=ag["min_nodes"], max_nodes=ag["max_nodes"],
                              nproc_per_node=cluster.node_by_name[node].num_gpus, run_id=ag["run_id"],
                              rdzv_backend="c10d", rdzv_endpoint=store_address(host, port),
                              rdzv_configs=dict(RDZV), max_restarts=ag["max_restarts"], monitor_interval=0.1,
                              start_method="fork", local_addr=local_addr,
                              logs_specs=DefaultLogsSpecs(log_dir=os.environ.get("ARACHNE_ELASTIC_TORCH_LOGS")))
        try:
            elastic_launch(config, worker_entry)(host, port, node)
        except SignalException as exc:  # the node was told to stop: it leaves the job
            return 128 + int(exc.sigval)
        except Exception as exc:  # noqa: BLE001 - restarts exhausted, the store gone: the job cannot go on here
            with contextlib.suppress(Exception):
                client.set(f"arachne/agent_error/{node}", json.dumps(_why(exc)[:2000]))
            raise JobError(f"node {node}: {_why(exc)}") from None
        return 0
    finally:
        with contextlib.suppress(Exception):
            client.set(f"arachne/exit/{node}", json.dumps(time.time()))


def exit_now(code: int) -> None:
    """End the agent process with ``code`` once its job is over, skipping the interpreter's teardown.

    torch's store and rendezvous objects own C++ threads; destroyed during interpreter shutdown while one is
    still joinable they abort the process ("terminate called without an active exception", exit -6) after
    a job that ended well. Everything the agent reports is already in the store or printed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def agent_main(argv: list[str] | None = None) -> int:
    """``python -m arachne.runtime.elastic_agent --store HOST:PORT --node NODE``: errors as one line."""
    ap = argparse.ArgumentParser(prog="python -m arachne.runtime.elastic_agent",
                                 description="Run one node's torch elastic agent for an arachne elastic job.")
    ap.add_argument("--store", required=True, help="HOST:PORT of the job's store")
    ap.add_argument("--node", required=True, help="this node's name in the job's cluster")
    ap.add_argument("--local-addr", default=None, help="address other nodes reach this one at")
    ap.add_argument("--connect-timeout", type=float, default=600.0, help="seconds to wait for the store")
    a = ap.parse_args(argv)
    try:
        return run_agent(a.store, a.node, a.local_addr, a.connect_timeout)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    exit_now(agent_main())
