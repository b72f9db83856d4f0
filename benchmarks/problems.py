"""The problems the benchmarks plan: the planners grid (25 cases), the random production-like clusters of
the robustness sweeps, and clusters built from (GPU, nodes, GPUs per node) triples (the latency tiers).

Shared by every subcommand through :mod:`benchmarks.common`; changing a generator changes every sweep drawn
after it, so the stored sweeps keep their clusters (``benchmarks/stored/``) instead of re-drawing them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.memory import state_bytes_per_param
from arachne.planners.arachne.train.problems import TRAINING_MODELS
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.gpus import gpu_catalog
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec, model_catalog

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


# ---- random production-like clusters (the robustness sweeps) ---------------------------------------------
SWEEP_PLANNERS = ["arachne", "megatron", "megatron-oblivious", "amp", "metis", "flashflex", "sailor"]
NODE_SIZES = (1, 2, 4, 8)
MAX_GPUS = 1024

# Catalog GPUs by era, with the weight of being drawn (old/cheap ones are common in real fleets).
GPU_POOL: dict[str, float] = {
    "P100": 1.0, "V100-16": 1.5, "V100-32": 1.0, "T4": 1.5, "RTX-2080-Ti": 0.5, "Titan-RTX": 0.4,
    "RTX-3090": 0.8, "RTX-4090": 0.8, "A10": 1.0, "A10G": 1.0, "L4": 1.0, "L40S": 0.8,
    "A100-40": 1.5, "A100-80": 1.5, "A100-PCIE-40": 0.5, "A800": 0.5, "H100": 1.5, "H100-PCIe": 0.5,
    "H800": 0.5, "H20": 0.4, "H200": 0.8, "GH200": 0.4, "B200": 0.3, "MI250X": 0.3, "MI300X": 0.3,
}
# GPUs usually sold in 8-GPU boards (their nodes are mostly 8; smaller ones are cloud slices).
BOARD_GPUS = {"V100-16", "V100-32", "A100-40", "A100-80", "A800", "H100", "H800", "H20", "H200", "B200",
              "MI300X"}

# Real products missing from the catalog, described by their features only (figures approximate).
CUSTOM_PRODUCTS: list[dict[str, Any]] = [
    {"name": "K80-die", "memory_gb": 12, "peak_tflops": 4.4, "memory_bandwidth_gbps": 240,
     "intra_node_gbps": 16, "inter_node_gbps": 1.25, "bf16": False, "intra_node_link": "pcie"},
    {"name": "A30-24GB", "memory_gb": 24, "peak_tflops": 165, "memory_bandwidth_gbps": 933,
     "intra_node_gbps": 64, "inter_node_gbps": 12.5, "intra_node_link": "pcie"},
    {"name": "A40-48GB", "memory_gb": 48, "peak_tflops": 149.7, "memory_bandwidth_gbps": 696,
     "intra_node_gbps": 64, "inter_node_gbps": 12.5, "intra_node_link": "pcie"},
    {"name": "RTX-A6000", "memory_gb": 48, "peak_tflops": 154.8, "memory_bandwidth_gbps": 768,
     "intra_node_gbps": 64, "inter_node_gbps": 3.125, "intra_node_link": "pcie"},
    {"name": "MI210", "memory_gb": 64, "peak_tflops": 181, "memory_bandwidth_gbps": 1638,
     "intra_node_gbps": 300, "inter_node_gbps": 25, "intra_node_link": "xgmi"},
    {"name": "Gaudi2-HL225", "memory_gb": 96, "peak_tflops": 432, "memory_bandwidth_gbps": 2450,
     "intra_node_gbps": 600, "inter_node_gbps": 300, "intra_node_link": "other"},
    {"name": "L20-48GB", "memory_gb": 48, "peak_tflops": 119.5, "memory_bandwidth_gbps": 864,
     "intra_node_gbps": 64, "inter_node_gbps": 25, "intra_node_link": "pcie"},
    {"name": "Quadro-RTX-8000", "memory_gb": 48, "peak_tflops": 130, "memory_bandwidth_gbps": 672,
     "intra_node_gbps": 32, "inter_node_gbps": 3.125, "bf16": False, "intra_node_link": "pcie"},
]


@dataclass
class RandomCase:
    name: str
    doc: dict[str, Any]
    model: str
    gbs: int
    seq: int
    num_gpus: int
    types: list[str]
    custom_types: list[str]
    node_sizes: dict[str, list[int]]
    model_state_fits: bool   # the cluster's total memory can hold weights + grads + optimizer state


def random_custom_type(rng: random.Random, k: int, node_sizes: tuple[int, ...] = NODE_SIZES) -> dict[str, Any]:
    """A GPU type known by its features only: a real product missing from the catalog, or a synthetic one."""
    if rng.random() < 0.6:
        t = dict(rng.choice(CUSTOM_PRODUCTS))
    else:
        mem = rng.choice([16, 24, 32, 40, 48, 64, 96, 128])
        link = rng.choice(["pcie", "pcie", "nvlink", "xgmi", "other"])
        t = {"name": f"Accel-{rng.randrange(16 ** 4):04x}-{mem}G", "memory_gb": mem,
             "peak_tflops": round(math.exp(rng.uniform(math.log(20), math.log(1500))), 1),
             "memory_bandwidth_gbps": round(math.exp(rng.uniform(math.log(250), math.log(5000)))),
             "intra_node_gbps": rng.choice([16, 32, 64, 128] if link == "pcie" else [200, 300, 600, 900]),
             "inter_node_gbps": rng.choice([1.25, 3.125, 6.25, 12.5, 25, 50, 100, 200]),
             "intra_node_link": link}
        if rng.random() < 0.3:
            t["bf16"] = False
    if rng.random() < 0.5:
        t["gpus_per_node"] = rng.choice(node_sizes)
    if rng.random() < 0.2:
        t["nics_per_node"] = rng.choice([1, 2, 4])
    t["name"] = f"{t['name']}-c{k}"   # unique per cluster, never a catalog name
    return t


SWEEP_MODELS = TRAINING_MODELS
"""Catalog models the random sweeps draw from (those of the stored sweeps, so a seed draws the same cases)."""


def model_state_bytes(model: ModelSpec, num_gpus: int, precision: str = "bf16") -> float:
    """The lower bound ``run_planner`` reports: one copy of the model state plus per-GPU overhead."""
    cal = DEFAULT_CALIBRATION.memory
    w, g, o = state_bytes_per_param(precision, cal)
    extra = cal.fp32_grad_buffer if precision == "fp32" else 0.0
    overhead = (cal.fp32_overhead_bytes if precision == "fp32" else cal.mixed_overhead_bytes) * num_gpus
    return model.num_params * (w + g + o + extra) + overhead


def random_case(rng: random.Random, index: int, node_sizes: tuple[int, ...] = NODE_SIZES) -> RandomCase:
    """One cluster document with a model and a job (node sizes drawn from ``node_sizes``)."""
    catalog = gpu_catalog()
    n_types = rng.randint(2, 6)
    names = list(GPU_POOL)
    chosen: list[str] = []
    while len(chosen) < n_types:
        g = rng.choices(names, weights=[GPU_POOL[n] for n in names])[0]
        if g not in chosen:
            chosen.append(g)
    customs: list[dict[str, Any]] = []
    if rng.random() < 1 / 3:
        for k in range(min(rng.choice([1, 1, 2]), n_types)):
            customs.append(random_custom_type(rng, k, node_sizes))
            chosen[k] = customs[-1]["name"]
    custom_by_name = {c["name"]: c for c in customs}

    def default_size_of(gpu: str) -> int:
        return custom_by_name[gpu].get("gpus_per_node", 8) if gpu in custom_by_name else catalog.get(gpu).gpus_per_node

    def gpus(group: dict[str, Any]) -> int:
        return group["count"] * group.get("gpus_per_node", default_size_of(group["gpu"]))

    target = round(math.exp(rng.uniform(math.log(4), math.log(MAX_GPUS))))
    weights = [rng.uniform(0.2, 1.0) for _ in chosen]
    groups: list[dict[str, Any]] = []
    sizes_of: dict[str, list[int]] = {}
    for t, (gpu, w) in enumerate(zip(chosen, weights)):
        share = target * w / sum(weights)
        if gpu in BOARD_GPUS and rng.random() < 0.7:
            sizes = [8] if rng.random() < 0.6 else [8, rng.choice([n for n in node_sizes if n != 8] or [8])]
        else:
            sizes = rng.sample(node_sizes, rng.choice([1, 1, 2]))
        sizes = sorted(set(sizes))
        sizes_of[gpu] = sizes
        for size in sizes:
            count = max(1, round(share / len(sizes) / size))
            entry: dict[str, Any] = {"name": f"{gpu.lower()}-x{size}-{{i}}", "count": count, "gpu": gpu}
            if size != default_size_of(gpu) or rng.random() < 0.7:   # sometimes rely on the type's default
                entry["gpus_per_node"] = size
            if rng.random() < 0.35:
                entry["inter_node_gbps"] = rng.choice([1.25, 3.125, 6.25, 12.5, 25, 50, 100])
            if rng.random() < 0.1:
                entry["intra_node_gbps"] = rng.choice([32, 64, 300])
            if rng.random() < 0.3:
                entry["zone"] = f"row-{t}"
            if count == 1 and rng.random() < 0.3:            # a lone node named without {i}
                entry["name"] = f"{gpu.lower()}-x{size}-solo"
            groups.append(entry)

    while sum(map(gpus, groups)) > MAX_GPUS:   # trim the biggest group
        max((g for g in groups if g["count"] > 1), key=gpus)["count"] -= 1
    while sum(map(gpus, groups)) < 4:
        g = rng.choice(groups)
        g["count"] += 1
        if "{i}" not in g["name"]:
            g["name"] = g["name"].replace("-solo", "-{i}")
    doc: dict[str, Any] = {"name": f"rob-{index:03d}", "nodes": groups}
    if customs:
        doc["gpu_types"] = customs
    if rng.random() < 0.4:
        rng.shuffle(doc["nodes"])

    cluster = cluster_from_dict(doc, doc["name"])  # fail here, not in the CLI, if the generator is wrong
    have = cluster.total_memory_bytes
    models = model_catalog().models
    roomy = [m for m in models if model_state_bytes(m, cluster.num_gpus) <= 0.6 * have]
    model = rng.choice(roomy if roomy and rng.random() < 0.85 else models)
    seqs = [s for s in (512, 1024, 2048, 3072, 4096, 8192) if s <= model.max_sequence_length]
    seq = rng.choice(seqs)
    gbs = rng.choice([16, 32, 64, 96, 128, 256, 384, 512, 1000, 1024, 2048])
    if gbs < cluster.num_gpus // 8 and rng.random() < 0.7:   # large clusters usually train big batches
        gbs = 2 ** math.ceil(math.log2(cluster.num_gpus))
    full = {g: (g if g in custom_by_name else catalog.get(g).name) for g in chosen}
    types = [f"{g}x{cluster.gpu_counts[full[g]]}" for g in chosen]   # short name x GPU count
    return RandomCase(name=doc["name"], doc=doc, model=model.name, gbs=gbs, seq=seq, num_gpus=cluster.num_gpus,
                types=types, custom_types=[c["name"] for c in customs],
                node_sizes=sizes_of,
                model_state_fits=model_state_bytes(model, cluster.num_gpus) <= have)


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
