"""The problems the benchmarks plan: the planners grid (25 cases), the random production-like clusters of
the robustness sweeps (drawn in ``arachne/planners/arachne/train/production.py``, which the ranker's training
shares; re-exported here), and clusters built from (GPU, nodes, GPUs per node) triples (the latency tiers).

Shared by every subcommand through :mod:`benchmarks.common`; changing a generator changes every sweep drawn
after it, so the stored sweeps keep their clusters (``benchmarks/stored/``) instead of re-drawing them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from arachne.planners.arachne.train.production import (  # noqa: F401  (re-exported for the benchmarks)
    NODE_SIZES,
    RandomCase,
    random_case,
    random_cases,
)
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.job import Job

# ---- the planners grid ------------------------------------------------------------------------------------
Group = tuple[str, int, int, float | None]   # GPU, nodes, GPUs per node, NIC GB/s (None: the GPU's default)


def grid_cluster(name: str, groups: list[Group]) -> Cluster:
    """A cluster document built from (gpu, nodes, gpus_per_node, inter_node_gbps) groups."""
    nodes = []
    for i, (gpu, count, per_node, gbps) in enumerate(groups):
        entry: dict[str, Any] = {"name": f"g{i}-{gpu.lower()}-{{i}}", "count": count, "gpu": gpu,
                                 "gpus_per_node": per_node}
        if gbps is not None:
            entry["inter_node_gbps"] = gbps
        nodes.append(entry)
    return cluster_from_dict({"name": name, "nodes": nodes}, name)


@dataclass(frozen=True)
class GridCase:
    cluster: str
    groups: tuple[Group, ...]
    model: str
    gbs: int
    seq: int

    @property
    def name(self) -> str:
        return f"{self.cluster}/{self.model}"


# (cluster name, groups) — network tiers: 1.25 (10 GbE), 3.125 (25 GbE), 12.5 (100 Gb), 25-50 (IB)
GRID_CLUSTERS: dict[str, tuple[Group, ...]] = {
    "lab-8": (("A100-40", 1, 4, 3.125), ("RTX-3090", 2, 2, 1.25)),
    "cloud-16": (("A10G", 2, 4, 6.25), ("L4", 2, 4, 6.25)),
    "a100-v100-24": (("A100-40", 1, 8, 12.5), ("V100-16", 4, 4, 12.5)),
    "edge-20": (("L4", 4, 2, 3.125), ("T4", 8, 1, 3.125), ("A10G", 1, 4, 3.125)),
    "h100-a100-l4-48": (("H100", 2, 8, 50.0), ("A100-80", 2, 8, 25.0), ("L4", 4, 4, 12.5)),
    "t4-a10g-64": (("T4", 10, 4, 3.125), ("A10G", 6, 4, 6.25)),
    "4type-80": (("H100", 2, 8, 50.0), ("A100-40", 4, 8, 25.0), ("L4", 3, 4, 12.5), ("T4", 4, 2, 6.25)),
    "h200-h100-128": (("H200", 6, 8, 50.0), ("H100", 10, 8, 50.0)),
    "a100-v100-256": (("A100-40", 12, 8, 25.0), ("V100-16", 40, 4, 12.5)),
    "hopper-ampere-512": (("H100", 24, 8, 50.0), ("A100-80", 40, 8, 25.0)),
}

GRID_CASES: list[GridCase] = [
    GridCase("lab-8", GRID_CLUSTERS["lab-8"], "OPT-350M", 64, 2048),
    GridCase("lab-8", GRID_CLUSTERS["lab-8"], "GPT-3-1.3B", 64, 2048),
    GridCase("cloud-16", GRID_CLUSTERS["cloud-16"], "GPT-3-1.3B", 128, 2048),
    GridCase("cloud-16", GRID_CLUSTERS["cloud-16"], "Qwen1.5-MoE-A2.7B", 128, 2048),
    GridCase("a100-v100-24", GRID_CLUSTERS["a100-v100-24"], "OPT-350M", 256, 2048),
    GridCase("a100-v100-24", GRID_CLUSTERS["a100-v100-24"], "LLaMA-2-7B", 128, 4096),
    GridCase("edge-20", GRID_CLUSTERS["edge-20"], "GPT-3-1.3B", 128, 2048),
    GridCase("h100-a100-l4-48", GRID_CLUSTERS["h100-a100-l4-48"], "LLaMA-2-13B", 256, 4096),
    GridCase("h100-a100-l4-48", GRID_CLUSTERS["h100-a100-l4-48"], "Mixtral-8x7B", 256, 4096),
    GridCase("t4-a10g-64", GRID_CLUSTERS["t4-a10g-64"], "GPT-3-1.3B", 256, 2048),
    GridCase("t4-a10g-64", GRID_CLUSTERS["t4-a10g-64"], "LLaMA-2-7B", 256, 2048),
    GridCase("4type-80", GRID_CLUSTERS["4type-80"], "LLaMA-2-13B", 512, 4096),
    GridCase("4type-80", GRID_CLUSTERS["4type-80"], "DeepSeek-MoE-16B", 512, 4096),
    GridCase("h200-h100-128", GRID_CLUSTERS["h200-h100-128"], "LLaMA-2-70B", 512, 4096),
    GridCase("h200-h100-128", GRID_CLUSTERS["h200-h100-128"], "Mixtral-8x7B", 512, 4096),
    GridCase("a100-v100-256", GRID_CLUSTERS["a100-v100-256"], "LLaMA-2-7B", 1024, 4096),
    GridCase("a100-v100-256", GRID_CLUSTERS["a100-v100-256"], "OPT-350M", 1024, 2048),
    GridCase("hopper-ampere-512", GRID_CLUSTERS["hopper-ampere-512"], "LLaMA-2-70B", 1024, 4096),
    GridCase("hopper-ampere-512", GRID_CLUSTERS["hopper-ampere-512"], "GPT-3-1.3B", 2048, 2048),
    # more MoE: memory-tight small GPUs on slow links, and large fast clusters
    GridCase("a100-v100-24", GRID_CLUSTERS["a100-v100-24"], "Qwen1.5-MoE-A2.7B", 256, 2048),
    GridCase("t4-a10g-64", GRID_CLUSTERS["t4-a10g-64"], "DeepSeek-MoE-16B", 256, 2048),
    GridCase("a100-v100-256", GRID_CLUSTERS["a100-v100-256"], "Mixtral-8x7B", 1024, 4096),
    GridCase("hopper-ampere-512", GRID_CLUSTERS["hopper-ampere-512"], "DeepSeek-MoE-16B", 2048, 4096),
    # the catalog's fine-grained MoE (64 experts, top-8) and its largest (141B parameters)
    GridCase("h200-h100-128", GRID_CLUSTERS["h200-h100-128"], "Qwen2-57B-A14B", 512, 4096),
    GridCase("hopper-ampere-512", GRID_CLUSTERS["hopper-ampere-512"], "Mixtral-8x22B", 1024, 4096),
]

GRID_QUICK = [GRID_CASES[1], GRID_CASES[3], GRID_CASES[4], GRID_CASES[6]]

# search baselines timed at growing scale (--timing): 2 GPU types, 8-GPU nodes, uneven counts
TIMING_SIZES = {
    64: (("A100-80", 5, 8, 25.0), ("V100-16", 3, 8, 12.5)),
    256: (("A100-80", 20, 8, 25.0), ("V100-16", 12, 8, 12.5)),
    512: (("A100-80", 40, 8, 25.0), ("V100-16", 24, 8, 12.5)),
}
TIMING_PLANNERS = ["megatron", "amp", "metis", "flashflex", "sailor"]

# clusters past the grid, as large training sites build them (``grid scale``): 4,096 to 100,000 GPUs in 8-GPU
# nodes with the catalog's NICs (one 400 Gb/s NIC per Hopper GPU; one case with a single 400 GbE NIC per
# node); the 16,384-GPU case is Llama 3 405B's published job (2,048 x 8,192 tokens)
SCALE_CASES: list[GridCase] = [
    GridCase("h100-4096", (("H100", 512, 8, None),), "Llama-3.1-70B", 1024, 8192),
    GridCase("h100-4096-eth", (("H100", 512, 8, 50.0),), "Llama-3.1-70B", 1024, 8192),  # one 400 GbE NIC a node
    GridCase("h100-a100-8192", (("H100", 512, 8, None), ("A100-80", 512, 8, None)), "Llama-3.1-70B", 2048, 4096),
    GridCase("h100-16384", (("H100", 2048, 8, None),), "Llama-3.1-405B", 2048, 8192),
    GridCase("hopper-ampere-24576", (("H200", 1024, 8, None), ("H100", 1024, 8, None), ("A100-80", 1024, 8, None)),
             "Qwen3-235B-A22B", 4096, 4096),
    GridCase("h100-100000", (("H100", 12500, 8, None),), "Llama-3.1-70B", 2048, 8192),
]

# one or two NICs per node (12.5-100 GB/s) and one per GPU (the catalog's), 64-2,048 GPUs in 8-GPU
# nodes at 4k-16k tokens (``grid nic``): where a node's GPUs share a thin NIC, cp in place of tp pays (decision
# 0050). The first two were tuned on; the other ten were drawn as hold-outs (decision 0050 says when)
NIC_CASES: list[GridCase] = [
    GridCase("h100-512-eth", (("H100", 64, 8, 50.0),), "Llama-3.1-70B", 256, 8192),
    GridCase("h100-1024-100", (("H100", 128, 8, 100.0),), "Llama-3.1-70B", 512, 8192),
    GridCase("a100-256-25", (("A100-80", 32, 8, 25.0),), "Llama-3.1-8B", 512, 8192),
    GridCase("h200-128-50", (("H200", 16, 8, 50.0),), "Llama-3.1-70B", 128, 16384),
    GridCase("h100-a100-512", (("H100", 32, 8, 50.0), ("A100-80", 32, 8, 25.0)), "Llama-3.1-70B", 256, 8192),
    GridCase("h100-256-moe", (("H100", 32, 8, 50.0),), "Mixtral-8x22B", 256, 8192),
    GridCase("a100-512-25", (("A100-80", 64, 8, 25.0),), "Llama-3.1-70B", 256, 8192),
    GridCase("h100-2048-50", (("H100", 256, 8, 50.0),), "Llama-3.1-405B", 512, 8192),
    GridCase("h200-64-50", (("H200", 8, 8, 50.0),), "Llama-3.1-8B", 128, 16384),
    GridCase("h100-256", (("H100", 32, 8, None),), "Llama-3.1-70B", 256, 8192),
    GridCase("h100-a100-384-moe", (("H100", 24, 8, 50.0), ("A100-80", 24, 8, 25.0)), "Qwen3-30B-A3B", 256, 4096),
    GridCase("a100-128-12", (("A100-40", 16, 8, 12.5),), "Llama-3.1-8B", 256, 4096),
]


# a batch too small for its cluster (``grid starved``): a GPU type holds more GPUs than the batch fills at one stage
# of node-wide tp per sequence (decision 0052). h100-100000 (the ``grid scale`` case) was tuned on; the next eight
# were drawn before the family was run on them, and three of them then tuned on (h200-4096-moe: the family's own
# clocks; h100-a100-8192-b256 and b200-2048: its interleaved cuts); the last six drawn after that, of which
# h100-2048-moe was then tuned on (an MoE model's experts parallel in the family)
STARVED_CASES: list[GridCase] = [
    GridCase("h100-100000", (("H100", 12500, 8, None),), "Llama-3.1-70B", 2048, 8192),
    GridCase("h100-8192", (("H100", 1024, 8, None),), "Llama-3.1-8B", 512, 8192),
    GridCase("a100-2048", (("A100-80", 256, 8, None),), "Llama-3.1-8B", 128, 4096),
    GridCase("h100-16384-405b", (("H100", 2048, 8, None),), "Llama-3.1-405B", 1024, 8192),
    GridCase("h200-4096-moe", (("H200", 512, 8, None),), "Qwen3-30B-A3B", 256, 8192),
    GridCase("h100-a100-8192-b256", (("H100", 512, 8, None), ("A100-80", 512, 8, None)), "Llama-3.1-70B", 256, 8192),
    GridCase("b200-2048", (("B200-180GB", 256, 8, None),), "Llama-3.1-70B", 128, 16384),
    GridCase("h100-32768-eth", (("H100", 4096, 8, 50.0),), "Llama-3.1-70B", 1024, 8192),
    GridCase("h100-1024", (("H100", 128, 8, None),), "Llama-3.1-70B", 64, 4096),
    GridCase("h200-16384", (("H200", 2048, 8, None),), "Llama-3.1-70B", 1024, 8192),
    GridCase("a100-4096-25", (("A100-80", 512, 8, 25.0),), "Llama-3.1-8B", 256, 8192),
    GridCase("h100-2048-moe", (("H100", 256, 8, None),), "Mixtral-8x22B", 128, 8192),
    GridCase("mi300x-4096", (("MI300X", 512, 8, None),), "Llama-3.1-70B", 256, 8192),
    GridCase("h100-h200-16384", (("H100", 1024, 8, None), ("H200", 1024, 8, None)), "Llama-3.1-405B", 512, 8192),
    GridCase("gh200-4096", (("GH200", 1024, 4, None),), "Llama-3.1-70B", 256, 4096),
]

# ---- random production-like clusters (the robustness sweeps): arachne/planners/arachne/train/production.py
SWEEP_PLANNERS = ["arachne", "megatron", "megatron-oblivious", "amp", "metis", "flashflex", "sailor"]


# ---- clusters from (gpu, nodes, gpus_per_node) triples; the latency tiers ---------------------------------
def triples_cluster(spec: list[tuple[str, int, int]], name: str = "bench", gpu_types: list[dict] | None = None,
                    inter: float | None = None) -> Cluster:
    """Cluster from (gpu, nodes, gpus_per_node) triples."""
    nodes = []
    for i, (gpu, n, size) in enumerate(spec):
        e: dict[str, Any] = {"name": f"g{i}-{{i}}", "count": n, "gpu": gpu, "gpus_per_node": size}
        if inter:
            e["inter_node_gbps"] = inter
        nodes.append(e)
    return cluster_from_dict({"name": name, "nodes": nodes, **({"gpu_types": gpu_types} if gpu_types else {})})


TIERS = (8, 32, 64, 128, 256, 512, 1024)
LATENCY_TYPES = ["H100", "A100-80", "A100-40", "V100-16", "L4", "T4", "A10G", "H200"]


def latency_clusters() -> list[tuple[int, int, Cluster, Job]]:
    """(GPUs, types, cluster, job): 19 clusters of 8-1024 GPUs and 2-6 types, LLaMA-2-13B's job (seeded draw;
    ``arachne latency`` and ``same-plans`` plan exactly these)."""
    rng = random.Random(0)
    out = []
    for n_gpus in TIERS:
        for n_types in (2, 4, 6):
            if n_types * 4 > n_gpus:
                continue
            chosen, per = rng.sample(LATENCY_TYPES, n_types), n_gpus // n_types
            spec = [(g, max(1, per // (8 if per >= 8 else 4)), 8 if per >= 8 else 4) for g in chosen]
            out.append((n_gpus, n_types, triples_cluster(spec, f"{n_gpus}x{n_types}"),
                        Job(global_batch_size=max(64, n_gpus), sequence_length=2048)))
    return out
