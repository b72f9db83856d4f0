"""Random but realistic planning problems: clusters (catalog and synthetic GPU types, node sizes
1-8, uneven counts, network tiers), models (catalog and synthetic shapes, dense and MoE), jobs."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from arachne.cost.calibration import DEFAULT_CALIBRATION
from arachne.cost.memory import state_bytes_per_param
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.gpus import gpu_catalog
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec, model_catalog

# GPU types never shown in training: the generalisation benchmark describes them by features only.
HOLDOUT_GPUS = ("H200-SXM-141GB", "L40S", "MI300X", "A10")


@dataclass
class ProblemConfig:
    """Ranges of the generated problems."""

    min_types: int = 1
    max_types: int = 6
    max_gpus_per_type: int = 192
    max_total_gpus: int = 512
    second_node_size_share: float = 0.2  # a GPU type also present in nodes of another size
    synthetic_gpu_share: float = 0.3
    synthetic_model_share: float = 0.3
    node_sizes: tuple[int, ...] = (1, 2, 4, 8)
    exclude_gpus: tuple[str, ...] = HOLDOUT_GPUS


@dataclass
class Problem:
    cluster_doc: dict[str, Any]
    model_doc: dict[str, Any] | str
    job: dict[str, Any]

    def build(self) -> tuple[Cluster, ModelSpec, Job]:
        from arachne.spec.model import load_model

        return cluster_from_dict(self.cluster_doc, "problem"), load_model(self.model_doc), Job(**self.job)


def _synthetic_gpu(rng: random.Random, name: str) -> dict[str, Any]:
    peak = math.exp(rng.uniform(math.log(15), math.log(2500)))
    nvlink = rng.random() < min(0.9, peak / 800)
    return {
        "name": name, "memory_gb": rng.choice([12, 16, 24, 32, 40, 48, 64, 80, 96, 128, 141, 192]),
        "peak_tflops": round(peak, 1), "memory_bandwidth_gbps": round(peak * rng.uniform(2.5, 8.0) + 200, 0),
        "intra_node_gbps": rng.choice([600, 900, 1800, 400]) if nvlink else rng.choice([32, 64, 128]),
        "inter_node_gbps": rng.choice([1.25, 3.125, 6.25, 12.5, 25, 50, 100, 200, 400]),
        "fp32_tflops": round(peak / rng.uniform(6, 16), 1),
        "intra_node_link": "nvlink" if nvlink else "pcie",
    }


def _synthetic_model(rng: random.Random) -> dict[str, Any]:
    heads = rng.choice([16, 24, 32, 40, 48, 64])
    head_dim = rng.choice([64, 80, 128])
    h = heads * head_dim
    moe = rng.random() < 0.3
    doc: dict[str, Any] = {
        "name": f"synthetic-{rng.randrange(10**6)}", "num_layers": rng.choice([12, 16, 24, 28, 32, 40, 48, 60, 80]),
        "hidden_size": h, "ffn_hidden_size": int(h * rng.choice([2.6875, 3.5, 4])) // 64 * 64,
        "num_attention_heads": heads, "num_kv_heads": rng.choice([heads, heads // 2, 8 if heads % 8 == 0 else heads]),
        "vocab_size": rng.choice([32000, 50257, 128256]), "max_sequence_length": 8192,
        "mlp": rng.choice(["gelu", "swiglu"]), "bias": False, "position_embedding": "rope",
    }
    if moe:
        E = rng.choice([8, 16, 32, 64])
        doc.update(num_experts=E, experts_top_k=rng.choice([1, 2, 4]) if E > 4 else 2,
                   moe_ffn_hidden_size=max(256, doc["ffn_hidden_size"] // rng.choice([1, 4, 8]) // 64 * 64))
    return doc


TRAINING_MODELS = (
    "OPT-350M", "GPT-Neo-2.7B", "GPT-3-1.3B", "GPT-3-2.7B", "GPT-3-6.7B", "GPT-3-13B", "LLaMA-2-7B",
    "LLaMA-2-13B", "LLaMA-2-70B", "LLaMA-3-8B", "LLaMA-3-70B", "Mixtral-8x7B", "Mixtral-8x22B",
    "DeepSeek-MoE-16B", "Qwen1.5-MoE-A2.7B", "Qwen2-57B-A14B", "OPT-350", "GPT-Neo-2.7", "LLAMA-3-8",
    "OPT-30",
)
"""Catalog models the generator draws from: the ones the shipped checkpoints were trained on. Newer
catalog entries join at the next retraining (add them here then), so a seed keeps drawing the same problems."""

TRAINING_GPUS = (
    "V100-SXM2-16GB", "V100-SXM2-32GB", "P100-PCIE-16GB", "T4", "A10", "A10G", "L4", "L40S", "RTX-2080-Ti",
    "Titan-RTX", "RTX-3090", "RTX-4090", "A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIE-40GB",
    "A100-PCIE-80GB", "A800-SXM4-80GB", "H100-SXM5-80GB", "H100-PCIE-80GB", "H800-SXM5-80GB", "H20",
    "H200-SXM-141GB", "GH200-96GB", "B200", "MI250X", "MI300X",
)
"""Catalog GPU types the generator draws from, for the same reason as :data:`TRAINING_MODELS`."""


def random_problem(rng: random.Random, cfg: ProblemConfig = ProblemConfig()) -> Problem:
    """One feasible problem: the cluster can hold the model state with room to spare."""
    catalog = [gpu_catalog().get(n) for n in TRAINING_GPUS if n not in cfg.exclude_gpus]
    models = [model_catalog().get(n) for n in TRAINING_MODELS]
    while True:
        n_types = rng.randint(cfg.min_types, cfg.max_types)
        nodes, custom, total = [], [], 0
        for t in range(n_types):
            if rng.random() < cfg.synthetic_gpu_share:
                g = _synthetic_gpu(rng, f"SynthGPU-{t}")
                custom.append(g)
                gname = g["name"]
            else:
                gname = rng.choice(catalog).name
            size = rng.choice(cfg.node_sizes)
            count = max(size, int(math.exp(rng.uniform(0, math.log(cfg.max_gpus_per_type)))) // size * size)
            if total + count > cfg.max_total_gpus:
                continue
            total += count
            entry: dict[str, Any] = {"name": f"t{t}-{{i}}", "count": count // size, "gpu": gname, "gpus_per_node": size}
            if rng.random() < 0.3:
                entry["inter_node_gbps"] = rng.choice([1.25, 3.125, 12.5, 25, 50, 100, 200, 400])
            nodes.append(entry)
            if rng.random() < cfg.second_node_size_share:  # the same GPUs in nodes of another size
                other = rng.choice([n for n in cfg.node_sizes if n != size] or [size])
                k = rng.randint(1, max(1, 64 // other))
                if total + k * other <= cfg.max_total_gpus:
                    total += k * other
                    nodes.append({"name": f"t{t}b-{{i}}", "count": k, "gpu": gname, "gpus_per_node": other,
                                  "inter_node_gbps": rng.choice([1.25, 3.125, 6.25, 12.5, 25])})
        if not nodes:
            continue
        cluster_doc = {"name": "generated", "nodes": nodes, **({"gpu_types": custom} if custom else {})}
        if rng.random() < cfg.synthetic_model_share:
            model_doc: dict[str, Any] | str = _synthetic_model(rng)
        else:
            model_doc = rng.choice(models).name
        precision = "fp32" if rng.random() < 0.1 else "bf16"
        job = {"global_batch_size": rng.choice([16, 32, 64, 96, 128, 256, 512, 1024, 2048]),
               "sequence_length": rng.choice([1024, 2048, 2048, 4096]), "precision": precision}
        prob = Problem(cluster_doc, model_doc, job)
        try:
            cluster, model, jb = prob.build()
        except Exception:  # a generated shape broke a validator: draw again
            continue
        w, g, o = state_bytes_per_param(precision, DEFAULT_CALIBRATION.memory)
        need = model.num_params * (w + g + o)
        if cluster.total_memory_bytes > 1.6 * need and model.num_params < 2e11:
            return prob
