"""The model state a device must receive to move from one plan to another.

A device of the new plan needs the weights and optimizer state of its blocks (its tensor-parallel
shard; experts sharded by ``ep``; the optimizer state divided across ZeRO-1 replicas), plus the
embedding on first stages and the head on last stages. It already has a block when the old plan
placed the same block on it with the same ``tp`` and ``ep``; everything else arrives over its node's
network link, which the node's devices share. Gradients are not moved (the next step recomputes them).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from arachne.cost.calibration import MemoryCalibration
from arachne.cost.memory import state_bytes_per_param
from arachne.plan import Plan, Stage
from arachne.spec.cluster import Cluster
from arachne.spec.model import ModelSpec


@dataclass(frozen=True)
class Migration:
    """Bytes moved to adopt a new plan, and the time at the receiving nodes' network bandwidth."""

    bytes_moved: float
    max_node_bytes: float
    seconds: float
    devices_unchanged: int  # devices of the new plan that already hold all they need
    devices: int

    def to_doc(self) -> dict[str, float | int]:
        return {"bytes_moved": self.bytes_moved, "max_node_bytes": self.max_node_bytes, "seconds": self.seconds,
                "devices_unchanged": self.devices_unchanged, "devices": self.devices}


def _holdings(plan: Plan) -> dict[str, tuple[set[str], int, int]]:
    """Per device: the pieces it holds ("emb", "head", block indices as text), its tp and ep."""
    out: dict[str, tuple[set[str], int, int]] = {}
    for p in plan.pipelines:
        last = len(p.stages) - 1
        for si, st in enumerate(p.stages):
            pieces = {str(i) for i in range(st.start, st.end)}
            if si == 0:
                pieces.add("emb")
            if si == last:
                pieces.add("head")
            for d in st.devices:
                out[d] = (pieces, st.tp, st.ep)
    return out


def _replicas(plan: Plan) -> dict[str, int]:
    """How many dp groups hold each piece (the ZeRO-1 shard count)."""
    count: dict[str, int] = defaultdict(int)
    for p in plan.pipelines:
        last = len(p.stages) - 1
        for si, st in enumerate(p.stages):
            keys = [str(i) for i in range(st.start, st.end)] + (["emb"] if si == 0 else []) + \
                   (["head"] if si == last else [])
            for k in keys:
                count[k] += st.dp_size
    return count


def _piece_bytes(model: ModelSpec, piece: str, st: Stage, per_param: float, optimizer: float,
                 shards: int) -> float:
    """Bytes of one piece on one device of ``st``."""
    state = per_param + optimizer / max(1, shards)
    if piece == "emb":
        return model.embedding_params(st.tp) / st.tp * state
    if piece == "head":
        return model.head_params(st.tp) / st.tp * state
    i = int(piece)
    experts = model.block_expert_params(i)
    return ((model.block_params(i) - experts) / st.tp + experts / (st.tp * st.ep)) * state


def migration_cost(old: Plan, new: Plan, model: ModelSpec, cluster: Cluster,
                   cal: MemoryCalibration | None = None) -> Migration:
    """What each device of ``new`` must receive that ``old`` did not leave on it, and how long the
    transfers take when every node receives at its inter-node bandwidth at once."""
    w, _, o = state_bytes_per_param(new.precision, cal or MemoryCalibration())
    held = _holdings(old)
    shards = _replicas(new) if new.zero_stage == 1 else {}
    per_node: dict[str, float] = defaultdict(float)
    unchanged = total_devices = 0
    for p in new.pipelines:
        last = len(p.stages) - 1
        for si, st in enumerate(p.stages):
            need = {str(i) for i in range(st.start, st.end)} | ({"emb"} if si == 0 else set()) | \
                   ({"head"} if si == last else set())
            for d in st.devices:
                total_devices += 1
                have, tp, ep = held.get(d, (set(), 0, 0))
                missing = need - have if (tp, ep) == (st.tp, st.ep) else need
                if not missing:
                    unchanged += 1
                    continue
                node = cluster.devices[d].node.name
                per_node[node] += sum(_piece_bytes(model, k, st, w, o, shards.get(k, 1)) for k in missing)
    nodes = cluster.node_by_name
    seconds = max((b / nodes[n].inter_node_bw for n, b in per_node.items()), default=0.0)
    return Migration(sum(per_node.values()), max(per_node.values(), default=0.0), seconds, unchanged,
                     total_devices)
