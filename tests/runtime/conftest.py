"""Tiny models, plans and comparison helpers for the runtime tests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import pytest

from arachne.plan import Plan, plan_from_dict, validate_plan
from arachne.spec.cluster import Cluster, cluster_from_dict
from arachne.spec.model import ModelSpec

DENSE: dict[str, Any] = {"name": "tiny-dense", "num_layers": 4, "hidden_size": 32, "ffn_hidden_size": 64,
                         "num_attention_heads": 4, "num_kv_heads": 2, "vocab_size": 97, "max_sequence_length": 16}
# GQA where tp=2 does not divide the 3 KV heads (overlapping KV shards), tied embeddings, swiglu, rope, RMSNorm
GQA_TIED: dict[str, Any] = {"name": "tiny-gqa", "num_layers": 3, "hidden_size": 48, "ffn_hidden_size": 40,
                            "num_attention_heads": 6, "num_kv_heads": 3, "vocab_size": 101, "max_sequence_length": 16,
                            "mlp": "swiglu", "bias": False, "position_embedding": "rope", "tied_embeddings": True}
MOE: dict[str, Any] = {"name": "tiny-moe", "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64,
                       "num_attention_heads": 4, "vocab_size": 97, "max_sequence_length": 16, "num_experts": 4,
                       "experts_top_k": 2, "moe_ffn_hidden_size": 48, "num_shared_experts": 1}

CLUSTER_DOC: dict[str, Any] = {"name": "local", "nodes": [{"name": "n0", "gpu": "A100-40", "gpus_per_node": 8}]}


def stage(a: int, b: int, devs: list[int], **kw: Any) -> dict[str, Any]:
    return {"layers": [a, b], "devices": [f"n0:{d}" for d in devs], **kw}


def make_plan(model: dict[str, Any], pipelines: list[dict[str, Any]], gbs: int = 8, seq: int = 8, mbs: int = 2,
              **kw: Any) -> dict[str, Any]:
    return {"format": "arachne-plan/1", "model": model, "global_batch_size": gbs, "sequence_length": seq,
            "micro_batch_size": mbs, "precision": "fp32", "pipelines": pipelines, **kw}


@pytest.fixture
def cluster() -> Cluster:
    return cluster_from_dict(CLUSTER_DOC)


@pytest.fixture
def load() -> Callable[[dict[str, Any]], tuple[Plan, ModelSpec]]:
    """Build and validate a plan document against the 8-device test cluster."""

    def build(doc: dict[str, Any]) -> tuple[Plan, ModelSpec]:
        plan = plan_from_dict(doc, "test-plan")
        return plan, validate_plan(plan, cluster_from_dict(CLUSTER_DOC), source="test-plan")

    return build


def assert_matches(got: dict[str, Any], ref: dict[str, Any], rtol: float = 1e-5) -> None:
    """Every canonical tensor matches the reference.

    Global: ||got - ref|| / ||ref|| over all tensors <= rtol. Per element: |got - ref| <=
    rtol*|ref| + 1e-5. The absolute slack exists because Adam divides by sqrt(v): an entry whose
    true gradient is zero or nearly so (attention key biases have an exactly zero gradient:
    softmax ignores them) moves by rounding noise, differently in any two summation orders. A
    wrong shard or a missed contribution moves entries by about lr (1e-3), far above it.
    """
    import torch

    assert set(got) == set(ref), sorted(set(got) ^ set(ref))
    num = sum(float((got[k] - ref[k]).double().pow(2).sum()) for k in ref)
    den = sum(float(ref[k].double().pow(2).sum()) for k in ref)
    assert (num / den) ** 0.5 <= rtol, f"global relative error {(num / den) ** 0.5:.2e}"
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=rtol, atol=1e-5, msg=lambda m, k=k: f"{k}: {m}")


def assert_losses(got: list[float], ref: list[float], rtol: float = 1e-5) -> None:
    assert len(got) == len(ref)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= rtol * abs(b), f"step {i}: loss {a} vs reference {b}"


@pytest.fixture
def rt() -> SimpleNamespace:
    """The helpers above, for test modules (conftest modules are not imported by name)."""
    return SimpleNamespace(DENSE=DENSE, GQA_TIED=GQA_TIED, MOE=MOE, CLUSTER_DOC=CLUSTER_DOC, stage=stage,
                           make_plan=make_plan, assert_matches=assert_matches, assert_losses=assert_losses)
