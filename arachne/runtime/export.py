"""Export a plan as torchrun launch commands (+ rank map) or as Megatron-LM arguments (torch-free)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arachne.errors import InputError
from arachne.plan import Plan
from arachne.runtime.layout import Layout
from arachne.spec.cluster import Cluster
from arachne.spec.model import ModelSpec
from arachne.spec.names import check_name

RANKMAP_FORMAT = "arachne-rankmap/1"
EXPORT_RUNTIME = {"megatron": "megatron", "torchrun": "arachne"}
"""The runtime preset (:mod:`arachne.spec.runtimes`) whose rules each export format's framework follows."""


def runtime_refusal(plan: Plan, cluster: Cluster, fmt: str) -> tuple[str, str] | None:
    """(plan field, one-line reason) for the first rule of the format's runtime preset that ``plan`` breaks
    (the same rules ``arachne plan --runtime`` plans under); None when the framework can run it."""
    from arachne.spec.runtimes import Legality

    legality = Legality.of(EXPORT_RUNTIME[fmt])
    errs = legality.errors(plan, cluster)
    if not errs:
        return None
    field, reason = errs[0]
    return field, f"the {legality.runtime.name} runtime cannot run this plan: {reason}"


def _node(device: str) -> str:
    return device.split(":")[0]


def _index(device: str) -> int:
    return int(device.split(":")[1])


def node_devices(plan: Plan, cluster: Cluster) -> list[tuple[str, list[str]]]:
    """(node, its plan devices by local index) for every node the plan uses, in cluster order."""
    used: dict[str, list[str]] = {}
    for d in plan.devices:
        used.setdefault(_node(d), []).append(d)
    return [(n.name, sorted(used[n.name], key=_index)) for n in cluster.nodes if n.name in used]


def torchrun_export(plan: Plan, model: ModelSpec, cluster: Cluster, plan_path: str, cluster_path: str,
                    master_port: int = 29500, steps: int = 100) -> dict[str, Any]:
    """Per-node torchrun commands running ``arachne.runtime.worker`` and the rank map.

    torchrun gives node ``i`` the global ranks after those of nodes ``0..i-1``; local rank ``j``
    drives the node's ``j``-th plan device (by local index). The worker checks the mapping by
    gathering every rank's device name, so the map is informative, not load-bearing.
    """
    nodes = node_devices(plan, cluster)
    master = nodes[0][0]
    order = [d for _, devs in nodes for d in devs]
    lay = Layout(plan, model, order)
    out_nodes, offset = [], 0
    for i, (name, devs) in enumerate(nodes):
        cmd = ["torchrun", f"--nnodes={len(nodes)}", f"--node-rank={i}", f"--nproc-per-node={len(devs)}",
               f"--master-addr={master}", f"--master-port={master_port}", "-m", "arachne.runtime.worker",
               "--plan", plan_path, "--cluster", cluster_path, "--node-name", name, "--steps", str(steps)]
        out_nodes.append({"node": name, "node_rank": i, "nproc_per_node": len(devs), "devices": devs,
                          "first_rank": offset, "command": shlex.join(cmd)})
        offset += len(devs)
    ranks = []
    for role in lay.roles:
        ranks.append({"rank": role.rank, "device": role.device, "node": _node(role.device),
                      "local_rank": [d for n, ds in nodes if n == _node(role.device) for d in ds].index(role.device),
                      "cuda_device": _index(role.device), "pipeline": role.pipeline, "stage": role.stage,
                      "dp_group": role.group, "tp_rank": role.tp_rank, "layers": list(role.layers)})
    return {"format": RANKMAP_FORMAT, "world_size": lay.world_size, "master_addr": master,
            "master_port": master_port, "nodes": out_nodes, "ranks": ranks}


def output_path(out: str | Path, name: str) -> Path:
    """``out/name`` for a file that export writes, or :class:`InputError` when ``name`` is not one plain file
    name or the path would leave ``out`` (through ``..``, a separator, or a symlink inside ``out``)."""
    root = Path(out)
    if not name or name in (".", "..") or os.sep in name or (os.altsep and os.altsep in name) or "\0" in name \
            or any(c in name for c in "\n\r"):
        raise InputError(str(root), "-o", f"refusing to write {name!r}: not a plain file name")
    path = root / name
    if not path.resolve().is_relative_to(root.resolve()):
        raise InputError(str(root), "-o", f"refusing to write {name!r}: it would leave the output directory")
    return path


def launch_script(node: dict[str, Any]) -> str:
    """The ``launch_NODE.sh`` text for one entry of the rank map's ``nodes``. The node name is checked again
    (a Cluster built in code skips the reader's check) and every value is shell-quoted."""
    name = check_name(node["node"], field="nodes.node")
    first, last = int(node["first_rank"]), int(node["first_rank"]) + int(node["nproc_per_node"]) - 1
    argv = shlex.split(node["command"])  # the command is shlex.join(argv): re-quote each argument
    return (f"#!/bin/sh\n# node {shlex.quote(name)}: global ranks {first}..{last}\n"
            f"exec {shlex.join(argv)}\n")


def launch_script_name(node: dict[str, Any]) -> str:
    """``launch_NODE.sh`` (the node name checked by :func:`launch_script`)."""
    return f"launch_{check_name(node['node'], field='nodes.node')}.sh"


@dataclass
class MegatronExport:
    """Megatron-LM arguments for a plan, or the reasons it cannot be expressed."""

    args: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    rank_map: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons

    def to_doc(self) -> dict[str, Any]:
        return {"args": self.args, "command_line": shlex.join(self.args), "rank_map": self.rank_map,
                "notes": self.notes}


def _split_args(counts: list[int]) -> tuple[list[str], str | None]:
    """Megatron's uneven-split flags for per-stage layer counts, or why they cannot express it."""
    pp = len(counts)
    if pp == 1 or len(set(counts)) == 1:
        return [], None
    if pp == 2:
        return ["--decoder-first-pipeline-num-layers", str(counts[0])], None
    middle = counts[1:-1]
    if len(set(middle)) != 1:
        return [], f"uneven middle stages {counts} (Megatron sets only the first and last stage's layers)"
    m = middle[0]
    args = []
    if counts[0] != m:
        args += ["--decoder-first-pipeline-num-layers", str(counts[0])]
    if counts[-1] != m:
        args += ["--decoder-last-pipeline-num-layers", str(counts[-1])]
    return args, None


def _megatron_v2_reasons(plan: Plan, ref) -> list[str]:
    """Why Megatron-LM's flags cannot say a plan's version-2 settings (empty: they can)."""
    why = []
    if plan.zero_stage >= 2:
        why.append(f"zero_stage {plan.zero_stage} (Megatron-LM's distributed optimizer is ZeRO-1; its FSDP is not "
                   "exported)")
    for key in ("sequence_parallel", "cp", "etp", "recompute_layers"):
        if len({getattr(s, key) for s in ref.stages}) > 1:
            why.append(f"per-stage {key} (one value for the whole model in Megatron)")
    if ref.virtual_stages > 1 and len({b - a for s in ref.stages for a, b in s.ranges}) > 1:
        why.append("interleaved chunks of unequal sizes (--num-layers-per-virtual-pipeline-stage is one number)")
    if ref.virtual_stages > 1 and any(s.recompute_layers is not None for s in ref.stages):
        why.append("partial recomputation with interleaving (Megatron counts it per chunk)")
    if plan.framework == "torch":
        why.append("framework torch (a plan for plain PyTorch modules)")
    if plan.moe_kernels not in (None, "grouped"):
        why.append(f"moe_kernels {plan.moe_kernels} (Megatron-Core's MoE layer is the grouped kind)")
    return why


def _megatron_v2_args(plan: Plan, ref, model: ModelSpec) -> list[str]:
    """Megatron-LM flags for the plan's version-2 settings (checked by :func:`_megatron_v2_reasons`)."""
    st0, a = ref.stages[0], []
    if st0.sequence_parallel:
        a += ["--sequence-parallel"]
    if st0.cp > 1:
        a += ["--context-parallel-size", str(st0.cp)]
    if model.is_moe and st0.etp is not None:
        a += ["--expert-tensor-parallel-size", str(st0.etp)]
    if ref.virtual_stages > 1:
        a += ["--num-layers-per-virtual-pipeline-stage", str(st0.ranges[0][1] - st0.ranges[0][0])]
    if plan.overlap_grad_reduce:
        a += ["--overlap-grad-reduce"]
    if plan.overlap_param_gather:
        a += ["--overlap-param-gather"]
    if plan.overlap_moe_comm and model.is_moe:
        a += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if plan.grad_reduce_in_fp32 is False:
        a += ["--grad-reduce-in-bf16"]
    if plan.precision == "fp8":
        a += ["--fp8-format", "hybrid"]
    if plan.fp8_params:  # the optional memory settings (the megatron preset refuses master_weights none)
        a += ["--fp8-param-gather"]
    if st0.recompute == "selective" and st0.recompute_modules is not None:
        a += ["--recompute-modules", *st0.recompute_modules]
    if plan.optimizer_state_dtype == "bf16":
        a += ["--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    if plan.loss == "fused":
        a += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    return a


def megatron_export(plan: Plan, model: ModelSpec) -> MegatronExport:
    """Megatron-LM arguments when the plan is a homogeneous 3D(+EP) layout Megatron can express."""
    out = MegatronExport()
    why = out.reasons
    ref = plan.pipelines[0]
    shape = lambda p: [(s.layers, s.tp, s.dp_size, s.ep, s.recompute) for s in p.stages]  # noqa: E731
    if any(shape(p) != shape(ref) for p in plan.pipelines[1:]):
        why.append("heterogeneous pipelines (replicas differ in stages, layer split, tp, dp, ep or recompute)")
    if any(p.micro_batches != ref.micro_batches for p in plan.pipelines[1:]):
        why.append("pipelines with different micro_batches")
    if len({plan.mbs(p) for p in plan.pipelines}) > 1:
        why.append("pipelines with different micro_batch_size")
    tps = {s.tp for s in ref.stages}
    if len(tps) > 1:
        why.append(f"per-stage tp {[s.tp for s in ref.stages]} (Megatron has one tensor-parallel size)")
    dps = {s.dp_size for s in ref.stages}
    if len(dps) > 1:
        why.append(f"per-stage dp {[s.dp_size for s in ref.stages]} (Megatron has one data-parallel size)")
    moe_eps = {s.ep for s in ref.stages if any(model.moe_layers[i] for a, b in s.ranges for i in range(a, b))}
    if len(moe_eps) > 1:
        why.append(f"per-stage ep {sorted(moe_eps)} (Megatron has one expert-parallel size)")
    if len({s.recompute for s in ref.stages}) > 1:
        why.append("recomputation on some stages only")
    if plan.schedule != "1f1b":
        why.append(f"schedule {plan.schedule!r} (Megatron runs 1F1B)")
    why += _megatron_v2_reasons(plan, ref)
    tp = next(iter(tps))
    if (shape := model.tp_error(tp, whole_kv_groups=model.kv_heads < model.num_attention_heads)) is not None:
        why.append(f"{shape} (Megatron-LM's rule)")
    split, err = _split_args([s.num_layers for s in ref.stages])
    if err:
        why.append(err)
    if why:
        return out
    d = next(iter(dps))
    pp = len(ref.stages)
    mbs = plan.mbs(ref)
    dp_total = len(plan.pipelines) * d
    ep = next(iter(moe_eps), 1)
    a = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp), *split]
    if model.is_moe:
        a += ["--expert-model-parallel-size", str(ep)]
    a += ["--micro-batch-size", str(mbs // d), "--global-batch-size", str(plan.global_batch_size),
          "--seq-length", str(plan.sequence_length)]
    st0 = ref.stages[0]
    if st0.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
    elif st0.recompute and st0.recompute_layers is not None:
        a += ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
              str(st0.recompute_layers)]
    elif st0.recompute:
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if plan.zero_stage == 1:
        a += ["--use-distributed-optimizer"]
    a += _megatron_v2_args(plan, ref, model)
    if plan.precision in ("bf16", "fp8"):
        a += ["--bf16"]
    elif plan.precision == "fp16":
        a += ["--fp16"]
    if plan.optimizer == "sgd":
        a += ["--optimizer", "sgd"]
    a += ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
          "--ffn-hidden-size", str(model.ffn_hidden_size), "--num-attention-heads", str(model.num_attention_heads),
          "--max-position-embeddings", str(model.max_sequence_length)]
    if model.kv_heads < model.num_attention_heads:
        a += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    if model.mlp == "swiglu":
        a += ["--swiglu"]
    if not model.bias:
        a += ["--disable-bias-linear", "--normalization", "RMSNorm"]
    if model.position_embedding == "rope":
        a += ["--position-embedding-type", "rope"]
    if not model.tied_embeddings:
        a += ["--untie-embeddings-and-output-weights"]
    if model.is_moe:
        a += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.experts_top_k)]
        if model.moe_ffn_hidden_size:
            a += ["--moe-ffn-hidden-size", str(model.moe_ffn_hidden_size)]
        if model.num_shared_experts:
            width = model.shared_expert_ffn_hidden_size or model.expert_ffn * model.num_shared_experts
            a += ["--moe-shared-expert-intermediate-size", str(width)]
        pattern = [int(x) for x in model.moe_layers]
        if not all(pattern):
            a += ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]
    out.args = a
    # Megatron's default rank order: tensor fastest, then data, then pipeline
    for pi, pipe in enumerate(plan.pipelines):
        for si, st in enumerate(pipe.stages):
            for g, devs in enumerate(st.groups()):
                for r, dev in enumerate(devs):
                    dp_idx = pi * d + g
                    out.rank_map.append({"rank": si * dp_total * tp + dp_idx * tp + r, "device": dev,
                                         "pipeline_stage": si, "data_parallel_rank": dp_idx, "tensor_rank": r})
    out.rank_map.sort(key=lambda x: x["rank"])
    nodes = [_node(x["device"]) for x in out.rank_map]
    if any(nodes[i] != nodes[i + 1] and nodes[i + 1] in nodes[:i + 1] for i in range(len(nodes) - 1)):
        out.notes.append("the plan's placement does not give each node a contiguous block of Megatron ranks; "
                         "launch with a rank-to-host mapping that follows rank_map")
    out.notes.append("data, tokenizer (vocab_size %d) and optimizer schedule arguments are not included"
                     % model.vocab_size)
    return out
