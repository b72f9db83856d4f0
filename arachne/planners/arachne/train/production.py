"""Random production-like planning problems: clusters shaped like real mixed fleets (2-6 GPU types drawn by
era, 8-GPU boards for the datacenter parts, custom types known by their features only, per-group NIC and
link overrides, zones, up to 1,024 GPUs), each with a catalog model and a job.

The robustness sweeps (``python -m benchmarks sweep run --seed S``) draw their clusters here, 30 per seed; the
ranker's training draws the same kind from seeds of its own (``arachne train-ranker --production N``,
:data:`TRAINING_SEEDS_FROM` up), so the sweeps' seeds below it stay hold-outs. Changing a draw changes every sweep
drawn after it, so the stored sweeps keep their clusters.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.memory import state_bytes_per_param
from arachne.planners.arachne.train.problems import TRAINING_MODELS, Problem
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.gpus import gpu_catalog
from arachne.spec.model import ModelSpec, model_catalog

TRAINING_SEEDS_FROM = 1000
"""The first seed the ranker's training draws production-like problems from; hold-out sweeps use seeds below it."""
CASES_PER_SEED = 30
"""Problems drawn per seed (a sweep's default ``--n``)."""

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


def random_cases(seed: int, n: int = CASES_PER_SEED, node_sizes: tuple[int, ...] | None = None) -> list[RandomCase]:
    """The first ``n`` random production-like cases of a seed (as ``sweep run --seed`` draws them)."""
    rng = random.Random(seed)
    return [random_case(rng, i, *([node_sizes] if node_sizes else [])) for i in range(n)]


def production_problems(n: int, first_seed: int = TRAINING_SEEDS_FROM) -> list[Problem]:
    """``n`` training problems drawn as the sweeps draw theirs, :data:`CASES_PER_SEED` per seed from
    ``first_seed`` up (seed ``first_seed + k`` gives problems ``30 k`` to ``30 k + 29``)."""
    out: list[Problem] = []
    seed = first_seed
    while len(out) < n:
        for rc in random_cases(seed)[: n - len(out)]:
            out.append(Problem(rc.doc, rc.model, {"global_batch_size": rc.gbs, "sequence_length": rc.seq}))
        seed += 1
    return out
