"""Clusters and planning contexts the arachne planner's tests share."""

from __future__ import annotations

from arachne.cost import CostModel
from arachne.planners.arachne.context import PlanningContext
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog


def throughputs(doc: dict, model: str, gbs: int, seq: int, planners: tuple[str, ...]) -> dict[str, float]:
    """Tokens/s of each planner's plan for a stored sweep case (``doc``: its cluster), as the sweeps run it (the
    arachne runtime's rules, a 10 s wall-clock cap)."""
    from arachne.planners.harness import run_planner
    from arachne.planners.protocol import SearchBudget
    from arachne.spec.runtimes import Legality

    cl = cluster_from_dict(doc)
    spec, job, cm = model_catalog().get(model), Job(global_batch_size=gbs, sequence_length=seq), CostModel(cl)
    return {name: run_planner(name, cl, spec, job, cm, SearchBudget(time_budget_s=10.0), Legality.of("arachne"))[1]
            .tokens_per_s for name in planners}


def small_cluster():
    return cluster_from_dict({"name": "s", "nodes": [
        {"name": "a{i}", "count": 1, "gpu": "A100-40", "gpus_per_node": 4},
        {"name": "v{i}", "count": 1, "gpu": "V100-16", "gpus_per_node": 4}]})


def ctx_for(model="GPT-3-1.3B", gbs=64, seq=2048, cluster=None):
    cl = cluster or small_cluster()
    job = Job(global_batch_size=gbs, sequence_length=seq)
    return PlanningContext(cl, model_catalog().get(model), job, CostModel(cl))


def five_type_cluster():
    """Five GPU types, fastest first, two node sizes: the shape of a large mixed inventory, scaled down."""
    return cluster_from_dict({"name": "five", "nodes": [
        {"name": "h{i}", "count": 4, "gpu": "H100", "gpus_per_node": 8},
        {"name": "a{i}", "count": 4, "gpu": "A100-80", "gpus_per_node": 8},
        {"name": "b{i}", "count": 2, "gpu": "A100-40", "gpus_per_node": 8},
        {"name": "v{i}", "count": 4, "gpu": "V100-16", "gpus_per_node": 4},
        {"name": "t{i}", "count": 4, "gpu": "T4", "gpus_per_node": 4}]})


def split_type_cluster():
    """14 A100s split between two 4-GPU nodes and six single-GPU nodes, beside 16 single T4s."""
    return cluster_from_dict({"name": "k", "nodes": [
        {"name": "a{i}", "count": 2, "gpu": "A100-80", "gpus_per_node": 4},
        {"name": "b{i}", "count": 6, "gpu": "A100-80", "gpus_per_node": 1},
        {"name": "t{i}", "count": 16, "gpu": "T4", "gpus_per_node": 1}]})


def odd_node_cluster():
    """Two H100 nodes that lost a GPU each (7 left) and three single-L4 nodes."""
    return cluster_from_dict({"name": "odd", "nodes": [
        {"name": "h{i}", "count": 2, "gpu": "H100", "gpus_per_node": 7, "inter_node_gbps": 50},
        {"name": "l{i}", "count": 3, "gpu": "L4", "gpus_per_node": 1, "inter_node_gbps": 3.125}]})


def a40_a10_t4_cluster():
    """seed2/rob-013: 14 two-GPU nodes of a features-only A40, 40 single A10s and 21 single T4s."""
    return cluster_from_dict({"name": "j", "gpu_types": [
        {"name": "A40-48GB-c0", "memory_gb": 48, "peak_tflops": 149.7, "memory_bandwidth_gbps": 696,
         "intra_node_gbps": 64, "inter_node_gbps": 12.5, "intra_node_link": "pcie", "gpus_per_node": 4}],
        "nodes": [{"name": "a{i}", "count": 14, "gpu": "A40-48GB-c0", "gpus_per_node": 2},
                  {"name": "t{i}", "count": 21, "gpu": "T4", "gpus_per_node": 1},
                  {"name": "g{i}", "count": 40, "gpu": "A10", "gpus_per_node": 1}]})


def h100_h800_t4_cluster():
    """odd108/rob-001: one node each of H100, H800 and T4 (the T4 node on 3 Gb/s)."""
    return cluster_from_dict({"name": "h", "nodes": [
        {"name": "h800-{i}", "count": 1, "gpu": "H800"},
        {"name": "t4-{i}", "count": 1, "gpu": "T4", "gpus_per_node": 8, "inter_node_gbps": 3.125},
        {"name": "h100-{i}", "count": 1, "gpu": "H100", "gpus_per_node": 8}]})


def rob021_cluster():
    """seed35/rob-021: 1010 GPUs of 5 classes, a Gaudi2 type known only by its features."""
    return cluster_from_dict({"name": "rob-021", "nodes": [
        {"name": "g{i}", "count": 10, "gpu": "Gaudi2-HL225-c0", "gpus_per_node": 8},
        {"name": "t2-{i}", "count": 89, "gpu": "T4", "gpus_per_node": 2},
        {"name": "t4-{i}", "count": 45, "gpu": "T4", "gpus_per_node": 4},
        {"name": "p{i}", "count": 174, "gpu": "A100-PCIE-40", "gpus_per_node": 2},
        {"name": "a{i}", "count": 28, "gpu": "A100-40", "gpus_per_node": 8, "zone": "row-3"}],
        "gpu_types": [{"name": "Gaudi2-HL225-c0", "memory_gb": 96, "peak_tflops": 432, "memory_bandwidth_gbps": 2450,
                       "intra_node_gbps": 600, "inter_node_gbps": 300, "intra_node_link": "other",
                       "gpus_per_node": 1}]})
