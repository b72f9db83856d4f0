"""``arachne export --format torchrun --elastic``: the commands of an elastic job on a real cluster (torch-free).

An elastic job has one store host and one agent per node (:mod:`arachne.runtime.elastic_agent`):

- ``elastic_store.sh`` (run on the store host, by default the first node the plan uses): ``arachne run
  --elastic --store HOST:PORT`` with the cluster and plan files, the job's settings (steps, checkpoint
  directory, checkpoint interval, horizon, node counts, the nodes admitted first) as flags. It hosts the
  job's TCP store (torch's c10d rendezvous and the job's own keys), writes the job's configuration there,
  admits the first nodes together and prints the documents the workers report;
- ``launch_NODE.sh``, one per node of the cluster (those the plan leaves idle too: they may join later):
  ``arachne elastic-agent --store HOST:PORT --node NODE``. The agent reads everything else (its GPUs,
  the node counts, the run id) from the job's configuration in the store.

Both scripts pass their own arguments on (``"$@"``): ``elastic_store.sh --json``, ``launch_n0.sh --local-addr
10.0.0.5``. Every value in a script is checked and shell-quoted.

The module also holds the torch-free checks both commands share: store addresses (``HOST:PORT``), node
names and counts, and the network look-ups of an agent (the interface that reaches the store, whether a
host is this machine, waiting for the store's port).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import socket
import struct
from dataclasses import dataclass
from typing import Any

from arachne.errors import InputError
from arachne.plan import Plan
from arachne.spec.cluster import Cluster
from arachne.spec.names import check_name

ELASTIC_FORMAT = "arachne-elastic-launch/1"
DEFAULT_STORE_PORT = 29400  # torch's default c10d rendezvous port
STORE_SCRIPT = "elastic_store.sh"
ELASTIC_DOC = "elastic.json"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def check_host(host: str, source: str = "", field: str = "--store-host") -> str:
    """``host`` when it is a host name (letters, digits, ``-``, dot-separated labels) or an IP address."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not isinstance(host, str) or len(host) > 253 or not _HOSTNAME.fullmatch(host):
        raise InputError(source, field, f"expected a host name or an IP address, got {host!r}")
    return host


def check_port(port: int, source: str = "", field: str = "--store-port") -> int:
    if not 1 <= int(port) <= 65535:
        raise InputError(source, field, f"expected a port from 1 to 65535, got {port}")
    return int(port)


def parse_store(text: str, source: str = "", field: str = "--store") -> tuple[str, int]:
    """``HOST:PORT`` (``[IPV6]:PORT`` for an IPv6 address) as (host, port), or :class:`InputError`."""
    host, sep, port = str(text).rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not port.isdigit():
        raise InputError(source, field, f"expected HOST:PORT, got {text!r}")
    return check_host(host, source, field), check_port(int(port), source, field)


def store_address(host: str, port: int) -> str:
    """``HOST:PORT`` (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def route_interface(host: str, port: int) -> str | None:
    """The name of the network interface this machine reaches ``host`` through (IPv4, Linux), or None."""
    try:
        import fcntl

        fam, _, _, _, addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0]
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect(addr)  # no packet is sent: this picks the route
            local = s.getsockname()[0]
            for _, name in socket.if_nameindex():
                try:
                    raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                except OSError:
                    continue
                if socket.inet_ntoa(raw[20:24]) == local:
                    return name
    except (OSError, IndexError, ImportError, AttributeError):  # not Linux: gloo's own choice
        return None
    return None


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """Whether ``host:port`` accepts a TCP connection within ``timeout_s`` (tried quietly every 0.5 s)."""
    import time

    end = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, max(0.1, end - time.monotonic()))):
                return True
        except OSError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.5)


def is_this_machine(host: str) -> bool:
    """Whether ``host`` resolves to an address of this machine (one a socket can bind to)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for fam, _, _, _, addr in infos:
        try:
            with socket.socket(fam, socket.SOCK_STREAM) as s:
                s.bind((addr[0], 0))
                return True
        except OSError:
            continue
    return False


def check_node_counts(cluster: Cluster, min_nodes: int, max_nodes: int | None) -> None:
    """``1 <= min_nodes <= max_nodes <= the cluster's nodes`` (``max_nodes`` None: the cluster's)."""
    nodes = len(cluster.nodes)
    if min_nodes < 1 or min_nodes > (max_nodes or nodes) or (max_nodes or 0) > nodes:
        raise InputError("", "--min-nodes", f"expected 1 <= --min-nodes <= --max-nodes <= {nodes} (the cluster's "
                                            f"nodes), got {min_nodes} and {max_nodes}")


def check_elastic_run(cluster: Cluster, simulate_devices: bool, store: str | None, checkpoint_dir: object,
                      min_nodes: int, max_nodes: int | None) -> tuple[str, int] | None:
    """The flags of ``arachne run --elastic`` checked (before torch is imported): the store's (host, port) with
    ``--store``, None with ``--simulate-devices``; exactly one of them, and a checkpoint directory."""
    address = parse_store(store) if store is not None else None
    if address is not None and simulate_devices:
        raise InputError("", "--store", "--simulate-devices hosts its own store on 127.0.0.1: give one of them")
    if address is None and not simulate_devices:
        raise InputError("", "--elastic", "add --simulate-devices (simulated nodes on this machine) or --store "
                                          "HOST:PORT (a cluster whose nodes run the scripts of `arachne export "
                                          "--format torchrun --elastic`)")
    if checkpoint_dir is None:
        raise InputError("", "--checkpoint-dir", "--elastic restores every restart from it: give one")
    check_node_counts(cluster, min_nodes, max_nodes)
    return address


def parse_nodes(text: str | None, cluster: Cluster, field: str = "--initial-nodes") -> list[str] | None:
    """Comma-separated node names of ``cluster`` (None for None), in the order given, without repeats."""
    if text is None:
        return None
    names = [x.strip() for x in text.split(",") if x.strip()]
    known = cluster.node_by_name
    for n in names:
        if n not in known:
            shown = ", ".join(list(known)[:8]) + (", ..." if len(known) > 8 else "")
            raise InputError("", field, f"{n!r} is not a node of the cluster ({shown})")
    if not names or len(set(names)) != len(names):
        raise InputError("", field, f"expected distinct node names separated by commas, got {text!r}")
    return names


def plan_nodes(plan: Plan, cluster: Cluster) -> list[str]:
    """The nodes ``plan`` uses, in cluster order."""
    used = {d.split(":")[0] for d in plan.devices}
    return [n.name for n in cluster.nodes if n.name in used]


@dataclass
class ElasticJobFlags:
    """The job's settings, as the store host's command passes them to ``arachne run --elastic``."""

    checkpoint_dir: str
    """A directory every node sees at the same path (a shared file system): every restart restores from it."""
    steps: int = 100
    """Steps to train (after a resume: on top of the checkpoint's)."""
    checkpoint_every: int = 1
    """Save a complete checkpoint every this many steps (and at the last step)."""
    horizon_steps: int = 1000
    """A joining node is taken only when its re-plan pays back within this many steps."""
    min_nodes: int = 1
    """Fewest nodes the rendezvous runs with."""
    max_nodes: int | None = None
    """Most nodes the rendezvous admits (default: the cluster's)."""
    initial_nodes: list[str] | None = None
    """Nodes admitted together at the start (default: the plan's)."""

    def argv(self, cluster: Cluster, plan: Plan) -> list[str]:
        first = self.initial_nodes or plan_nodes(plan, cluster)
        return ["--steps", str(self.steps), "--checkpoint-dir", self.checkpoint_dir, "--checkpoint-every",
                str(self.checkpoint_every), "--horizon-steps", str(self.horizon_steps), "--min-nodes",
                str(self.min_nodes), "--max-nodes", str(self.max_nodes or len(cluster.nodes)), "--initial-nodes",
                ",".join(check_name(n, field="--initial-nodes") for n in first)]


def elastic_export(plan: Plan, cluster: Cluster, plan_path: str, cluster_path: str, job: ElasticJobFlags,
                   store_host: str | None = None, store_port: int = DEFAULT_STORE_PORT) -> dict[str, Any]:
    """The ``arachne-elastic-launch/1`` document: the store host's command and one agent command per node of
    ``cluster`` (in cluster order). ``store_host`` defaults to the first node the plan uses."""
    check_node_counts(cluster, job.min_nodes, job.max_nodes)
    host = check_host(store_host if store_host is not None else plan_nodes(plan, cluster)[0])
    addr = store_address(host, check_port(store_port))
    store_cmd = ["arachne", "run", "--cluster", cluster_path, "--plan", plan_path, "--elastic", "--store", addr,
                 *job.argv(cluster, plan)]
    used = set(plan_nodes(plan, cluster))
    nodes = []
    for n in cluster.nodes:
        name = check_name(n.name, field="nodes.name")
        nodes.append({"node": name, "gpus": n.num_gpus, "in_plan": name in used,
                      "command": shlex.join(["arachne", "elastic-agent", "--store", addr, "--node", name])})
    return {"format": ELASTIC_FORMAT, "store_host": host, "store_port": store_port,
            "store_node": host if host in cluster.node_by_name else None,
            "store_command": shlex.join(store_cmd), "nodes": nodes}


def _script(comment: str, command: str) -> str:
    argv = shlex.split(command)  # the command is shlex.join(argv): re-quote each argument
    return f"#!/bin/sh\n# {comment}\nexec {shlex.join(argv)} \"$@\"\n"


def store_script(doc: dict[str, Any]) -> str:
    """``elastic_store.sh``: hosts the job's store and coordinates the job (run it on the store host)."""
    host = check_host(doc["store_host"], field="store_host")
    return _script(f"run on {shlex.quote(host)}: hosts the elastic job's store and coordinates the job",
                   doc["store_command"])


def agent_script(node: dict[str, Any]) -> str:
    """``launch_NODE.sh`` for one entry of the document's ``nodes``: that node's elastic agent."""
    name = check_name(node["node"], field="nodes.node")
    role = "in the plan" if node["in_plan"] else "idle in the plan: may join later"
    return _script(f"node {name} ({int(node['gpus'])} GPU(s), {role}): its elastic agent", node["command"])


def elastic_files(doc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(file name, text, executable) of every file ``export -o DIR --elastic`` writes."""
    import json

    out = [(ELASTIC_DOC, json.dumps(doc, indent=1) + "\n", False), (STORE_SCRIPT, store_script(doc), True)]
    out += [(f"launch_{check_name(n['node'], field='nodes.node')}.sh", agent_script(n), True) for n in doc["nodes"]]
    return out


def elastic_text(doc: dict[str, Any]) -> str:
    """The commands as text (``export --elastic`` without ``-o`` or ``--json``)."""
    lines = [f"# store host {doc['store_host']}: hosts the job's store and coordinates the job",
             doc["store_command"]]
    for n in doc["nodes"]:
        lines += [f"# node {n['node']} ({n['gpus']} GPU(s){'' if n['in_plan'] else ', idle in the plan'})",
                  n["command"]]
    return "\n".join(lines)
