"""``arachne export --format torchrun --elastic``: the files it writes, and the exported commands run for real.

The end-to-end test runs the exported scripts themselves on this machine (store host 127.0.0.1): the two
nodes' ``launch_NODE.sh`` (each an ``arachne elastic-agent``, started first) and ``elastic_store.sh`` (``arachne
run --elastic --store``), with CPU workers; the job must reach its last step with the losses of ``arachne run
--simulate-devices`` (not elastic) on the same plan and leave no process behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from procs import descendants
from typer.testing import CliRunner

from arachne.cli.app import app
from arachne.errors import InputError
from arachne.plan import plan_from_dict
from arachne.runtime.elastic_export import (
    ElasticJobFlags,
    agent_script,
    elastic_export,
    parse_store,
    route_interface,
    store_script,
)
from arachne.spec.cluster import cluster_from_dict

SIM = {"name": "SIM", "memory_gb": 5.06, "peak_tflops": 10, "memory_bandwidth_gbps": 100, "intra_node_gbps": 10,
       "inter_node_gbps": 1}
NODES = [{"name": "n0", "gpu": "SIM", "gpus_per_node": 1}, {"name": "n1", "gpu": "SIM", "gpus_per_node": 1},
         {"name": "n2", "gpu": "SIM", "gpus_per_node": 2}]
STEPS = 4


def two_stages(rt, a: str = "n0", b: str = "n1") -> dict:
    return rt.make_plan(rt.DENSE, [{"micro_batches": 4, "stages": [{"layers": [0, 2], "devices": [f"{a}:0"]},
                                                                   {"layers": [2, 4], "devices": [f"{b}:0"]}]}])


def write_inputs(tmp: Path, rt, nodes: list[dict] = NODES, plan_name: str = "plan.json",
                 gpu: dict = SIM) -> tuple[Path, Path]:
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "e", "nodes": nodes, "gpu_types": [gpu]}))
    plan = tmp / plan_name
    plan.write_text(json.dumps(two_stages(rt, nodes[0]["name"], nodes[1]["name"])))
    return cluster, plan


def half_model_gpu(rt) -> dict:
    """SIM with memory for half of the tiny model beyond the fixed per-GPU overhead, not for all of it (as the
    cost model estimates them): every plan for the job spans both nodes."""
    from arachne.cost import CostModel
    from arachne.plan import validate_plan

    cl = cluster_from_dict({"name": "e", "nodes": NODES[:2], "gpu_types": [{**SIM, "memory_gb": 1000}]})

    def memory(doc: dict) -> float:
        plan = plan_from_dict(doc, "plan")
        validate_plan(plan, cl, source="plan")
        return CostModel(cl).estimate(plan, validate=False).max_memory_bytes

    halves = memory(two_stages(rt))
    whole = min(memory(rt.make_plan(rt.DENSE, [{"micro_batches": 8 // m, "stages": [
        {"layers": [0, 4], "devices": ["n0:0"], "recompute": rc}]}], mbs=m)) for m in (1, 2, 4, 8)
        for rc in (False, True))
    assert halves < whole, (halves, whole)
    return {**SIM, "memory_gb": (halves + whole) / 2 / 2**30}


def export(cluster: Path, plan: Path, out: Path | None, *extra: object):
    args = ["export", "-c", cluster, "-p", plan, "-f", "torchrun", "--elastic", "--checkpoint-dir", "ck", *extra]
    if out is not None:
        args += ["-o", out]
    return CliRunner().invoke(app, [str(a) for a in args])


def test_every_node_of_the_cluster_gets_an_agent_script_and_one_node_the_store(rt, tmp_path):
    cluster, plan = write_inputs(tmp_path, rt)
    res = export(cluster, plan, tmp_path / "out", "--steps", 7, "--checkpoint-every", 3, "--horizon-steps", 50)
    assert res.exit_code == 0, res.output
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["elastic.json", "elastic_store.sh", "launch_n0.sh",
                                                      "launch_n1.sh", "launch_n2.sh"]
    doc = json.loads((out / "elastic.json").read_text())
    assert doc["format"] == "arachne-elastic-launch/1"
    assert (doc["store_host"], doc["store_port"], doc["store_node"]) == ("n0", 29400, "n0")  # the plan's first node
    assert [(n["node"], n["gpus"], n["in_plan"]) for n in doc["nodes"]] == [("n0", 1, True), ("n1", 1, True),
                                                                          ("n2", 2, False)]
    for n in ("n0", "n1", "n2"):
        script = out / f"launch_{n}.sh"
        assert os.access(script, os.X_OK)
        assert script.read_text().splitlines()[-1] == \
            f'exec arachne elastic-agent --store n0:29400 --node {n} "$@"'
    line = (out / "elastic_store.sh").read_text().splitlines()[-1]
    assert line.startswith(f"exec arachne run --cluster {cluster} --plan {plan} --elastic --store n0:29400 ")
    for flag in ("--steps 7", "--checkpoint-dir ck", "--checkpoint-every 3", "--horizon-steps 50", "--min-nodes 1",
                 "--max-nodes 3", "--initial-nodes n0,n1"):
        assert flag in line, flag
    # without -o: the same document, or the commands as text
    res = export(cluster, plan, None, "--json", "--store-host", "10.0.0.7", "--store-port", 1234)
    assert json.loads(res.stdout)["nodes"][2]["command"] == "arachne elastic-agent --store 10.0.0.7:1234 --node n2"
    text = export(cluster, plan, None).stdout
    assert text.count("arachne elastic-agent") == 3 and text.count("arachne run") == 1


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
def test_the_scripts_pass_paths_with_shell_characters_through_unchanged(rt, tmp_path):
    inputs = tmp_path / "in $(touch INJECTED) `x`; 'q'"
    inputs.mkdir()
    cluster, plan = write_inputs(inputs, rt, plan_name="p $HOME \"x\".json")
    res = CliRunner().invoke(app, ["export", "-c", str(cluster), "-p", str(plan), "-f", "torchrun", "--elastic",
                                   "--checkpoint-dir", "ck dir;$(touch INJECTED)", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    bin_dir = tmp_path / "bin"  # a fake arachne that records its arguments
    bin_dir.mkdir()
    fake = bin_dir / "arachne"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open(sys.argv[0] + '.args', 'w'))\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["sh", str(tmp_path / "out" / "elastic_store.sh"), "--json"], cwd=tmp_path, env=env, check=True,
                   timeout=30)
    args = json.loads((bin_dir / "arachne.args").read_text())
    assert args[args.index("--plan") + 1] == str(plan) and args[args.index("--cluster") + 1] == str(cluster)
    assert args[args.index("--checkpoint-dir") + 1] == "ck dir;$(touch INJECTED)" and args[-1] == "--json"
    subprocess.run(["sh", str(tmp_path / "out" / "launch_n2.sh"), "--local-addr", "10.1.2.3"], cwd=tmp_path, env=env,
                   check=True, timeout=30)
    assert json.loads((bin_dir / "arachne.args").read_text()) == [
        "elastic-agent", "--store", "n0:29400", "--node", "n2", "--local-addr", "10.1.2.3"]
    assert not list(tmp_path.rglob("INJECTED"))


@pytest.mark.parametrize("node", ["a\ntouch INJECTED #", "x/../../escaped", "$(touch INJECTED)", "a b"])
def test_a_hostile_node_name_is_refused_and_nothing_is_written(rt, tmp_path, node):
    nodes = [{"name": node, "gpu": "SIM", "gpus_per_node": 1}, {"name": "n1", "gpu": "SIM", "gpus_per_node": 1}]
    cluster, plan = write_inputs(tmp_path, rt, nodes)
    res = export(cluster, plan, tmp_path / "out")
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1 and "nodes[0].name" in res.stderr
    assert "Traceback" not in res.output
    assert not (tmp_path / "out").exists() and not list(tmp_path.rglob("INJECTED"))


def test_scripts_built_in_code_refuse_unsafe_values(rt):
    """A Cluster or a document built in code skips the readers' checks: the script writers check again."""
    with pytest.raises(InputError, match="nodes.node"):
        agent_script({"node": "a\ntouch INJECTED #", "gpus": 1, "in_plan": True, "command": "arachne"})
    with pytest.raises(InputError, match="store_host"):
        store_script({"store_host": "h;touch INJECTED", "store_command": "arachne run"})
    cluster = cluster_from_dict({"name": "e", "nodes": NODES, "gpu_types": [SIM]})
    plan = plan_from_dict(rt.make_plan(rt.DENSE, [{"micro_batches": 4, "stages": [
        {"layers": [0, 4], "devices": ["n0:0"]}]}]), "plan")
    for host in ("a b", "$(x)", "-rf", "h:1", "", "a..b"):
        with pytest.raises(InputError, match="--store-host"):
            elastic_export(plan, cluster, "p.json", "c.yaml", ElasticJobFlags(checkpoint_dir="ck"), host)
    with pytest.raises(InputError, match="--min-nodes"):
        elastic_export(plan, cluster, "p.json", "c.yaml", ElasticJobFlags(checkpoint_dir="ck", min_nodes=4))


def test_store_addresses():
    assert parse_store("n0:29400") == ("n0", 29400)
    assert parse_store("10.0.0.1:1") == ("10.0.0.1", 1)
    assert parse_store("[::1]:29400") == ("::1", 29400)
    for bad in ("n0", "n0:", "n0:0", "n0:65536", ":29400", "a b:1", "n0:29400x", "$(x):1"):
        with pytest.raises(InputError, match="--store"):
            parse_store(bad)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads interface addresses the Linux way")
def test_the_interface_towards_a_loopback_store_is_the_loopback_device():
    assert route_interface("127.0.0.1", 29400) == "lo"


@pytest.mark.slow
@pytest.mark.torch
def test_an_agent_for_a_node_the_cluster_does_not_have_is_refused(rt):
    pytest.importorskip("torch")
    import datetime

    import torch.distributed as dist

    from arachne.runtime.elastic_agent import run_agent
    from arachne.runtime.launch import free_port

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=10))
    store.set("arachne/cfg", json.dumps({"cluster": {"name": "e", "nodes": NODES, "gpu_types": [SIM]},
                                         "agent": {}}))
    with pytest.raises(InputError, match="--node: 'nX' is not a node of the job's cluster"):
        run_agent(f"127.0.0.1:{port}", "nX", connect_timeout_s=10)
    assert not store.check(["arachne/cand/n"])  # it never asked to join


# ---- the exported commands, run -----------------------------------------------------------------



def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not Path("/proc").is_dir() or shutil.which("sh") is None, reason="needs /proc and sh")
def test_the_exported_commands_train_the_job_to_its_last_step(rt, tmp_path):
    """Nodes n0 and n1 hold the plan; n2, idle in the plan, asks to join and is kept out (a horizon of 1 step)."""
    pytest.importorskip("torch")
    from arachne.runtime.launch import free_port

    nodes = NODES[:2] + [{"name": "n2", "gpu": "SIM", "gpus_per_node": 1}]
    cluster, plan = write_inputs(tmp_path, rt, nodes, gpu=half_model_gpu(rt))
    port = free_port()
    res = export(cluster, plan, tmp_path / "out", "--steps", STEPS, "--checkpoint-every", 2, "--horizon-steps", 1,
                 "--store-host", "127.0.0.1", "--store-port", port)
    assert res.exit_code == 0, res.output
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    out, logs = tmp_path / "out", tmp_path / "logs"
    logs.mkdir()
    procs: dict[str, subprocess.Popen] = {}
    seen: set[int] = set()
    try:
        # the agents first: they wait for the store host
        for name in ("launch_n0.sh", "launch_n1.sh", "launch_n2.sh", "elastic_store.sh"):
            extra = ["--json"] if name == "elastic_store.sh" else []
            with open(logs / f"{name}.out", "wb") as o, open(logs / f"{name}.err", "wb") as e:
                procs[name] = subprocess.Popen(["sh", str(out / name), *extra], cwd=tmp_path, env=env, stdout=o,
                                               stderr=e, start_new_session=True)
        end = time.monotonic() + 240
        while any(p.poll() is None for p in procs.values()) and time.monotonic() < end:
            seen |= descendants(os.getpid())
            time.sleep(0.2)
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for name, p in procs.items():
        assert p.returncode == 0, (name, p.returncode, (logs / f"{name}.err").read_text()[-3000:])
    docs = [json.loads(line) for line in (logs / "elastic_store.sh.out").read_text().splitlines()]
    steps = [d for d in docs if "step" in d and "event" not in d]
    events = [d for d in docs if "event" in d]
    assert [d["step"] for d in steps] == list(range(STEPS)) and docs[-1]["summary"] and docs[-1]["steps"] == STEPS
    assert events[0]["event"] == "start" and {x.split(":")[0] for x in events[0]["devices"]} == {"n0", "n1"}, events
    assert [(e["event"], e["joined"]) for e in events[1:]] == [("keep", ["n2:0"])], events  # judged, kept out
    assert {d["world_size"] for d in steps} == {2}

    ref = subprocess.run(["arachne", "run", "-c", str(cluster), "-p", str(plan), "--simulate-devices", "--steps",
                          str(STEPS), "--json"], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = [json.loads(line)["loss"] for line in ref.stdout.splitlines()]
    rt.assert_losses([d["loss"] for d in steps], want, rtol=1e-5)

    # no process left behind: every process the scripts started (agents, workers) has exited
    assert len(seen) >= 6, seen  # four commands, a worker for each agent admitted
    assert not [p for p in seen if _alive(p)]


class FakeStore:
    """The calls :class:`StoreAgents` makes of a TCPStore, on a dict."""

    def __init__(self) -> None:
        self.kv: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.kv[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.kv[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.kv for k in keys)

    def add(self, key: str, n: int) -> int:
        self.kv[key] = str(int(self.kv.get(key, b"0")) + n).encode()
        return int(self.kv[key])


@pytest.mark.slow  # imports torch
@pytest.mark.torch
def test_the_coordinator_sees_agents_through_the_store_only(monkeypatch):
    pytest.importorskip("torch")
    from arachne.runtime import elastic_agent
    from arachne.runtime.launch import JobError

    clock = [100.0]
    monkeypatch.setattr(elastic_agent.time, "monotonic", lambda: clock[0])
    store = FakeStore()
    agents = elastic_agent.StoreAgents(store)
    assert not agents.live()  # nobody asked yet
    for i, node in enumerate(("n0", "n1"), 1):
        store.add("arachne/cand/n", 1)
        store.set(f"arachne/cand/{i}", json.dumps(node))
        store.set(f"arachne/alive/{node}", json.dumps(1e9))  # another machine's clock: only changes count
    assert agents.nodes() == ["n0", "n1"] and agents.live()
    clock[0] += elastic_agent.AGENT_STALE_S + 1
    assert not agents.live()  # both silent since
    store.set("arachne/alive/n1", json.dumps(1e9 + 1))
    assert agents.live()
    store.set("arachne/exit/n1", json.dumps(0))
    assert not agents.live()  # exited
    agents.check()
    store.set("arachne/agent_error/n0", json.dumps("restarts exhausted"))
    with pytest.raises(JobError, match="the agent of node n0 failed: restarts exhausted"):
        agents.check()
