"""Catalog additions of issue 26: modern models (v2 shapes) and GPUs with FP8 rates."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from arachne.errors import InputError
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.gpus import TFLOPS, gpu_catalog
from arachne.spec.model import load_model, model_catalog

DOCS = Path(__file__).resolve().parents[2] / "docs" / "catalog.md"

# name -> (published total parameters, published active parameters or None, the source counts active
# parameters without the input embedding). Figures as the sources in models.yaml state them.
PUBLISHED = {
    "GPT-3-175B": (175.0e9, None, False),
    "Llama-3.1-8B": (8.03e9, None, False),
    "Llama-3.1-70B": (70.6e9, None, False),
    "Llama-3.1-405B": (405.9e9, None, False),
    "Mixtral-8x22B": (141e9, 39e9, False),
    "BLOOM-176B": (176_247_271_424, None, False),
    "Qwen3-30B-A3B": (30.5e9, 3.3e9, False),
    "Qwen3-235B-A22B": (235e9, 22e9, False),
    "DeepSeek-V3": (671e9, 37e9, False),       # main model; the 11.5B MTP module is not modelled
    "GPT-OSS-120B": (116.83e9, 5.13e9, True),
    "GPT-OSS-20B": (20.91e9, 3.61e9, True),
}


def entry(name: str):
    found = [m for m in model_catalog().models if m.name == name]
    assert len(found) == 1, f"{name} is not (exactly once) in the model catalog"
    return found[0]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_new_models_match_published_parameter_counts(name):
    total, active, without_input_embedding = PUBLISHED[name]
    model = entry(name)
    assert model.num_params == pytest.approx(total, rel=0.02)
    if active is None:
        assert not model.is_moe
        return
    counted = model.active_params - (model.vocab_size * model.hidden_size if without_input_embedding else 0)
    assert model.is_moe and counted == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_new_models_have_a_source_and_resolve_by_alias(name):
    model = entry(name)
    assert len(model.source) > 40
    for ref in (name, name.upper(), *model.aliases):
        assert load_model(ref).name == name


def test_v2_shapes():
    ds = entry("DeepSeek-V3")
    assert ds.attention == "mla" and (ds.kv_lora_rank, ds.q_lora_rank, ds.v_head_dim) == (512, 1536, 128)
    assert ds.moe_layers[:3] == (False, False, False) and all(ds.moe_layers[3:])
    assert (ds.num_experts, ds.experts_top_k, ds.num_shared_experts) == (256, 8, 1)
    for name, width in (("Qwen3-30B-A3B", 128), ("Qwen3-235B-A22B", 128), ("GPT-OSS-120B", 64)):
        m = entry(name)
        assert m.head_dim == width != m.hidden_size // m.num_attention_heads
    assert entry("BLOOM-176B").position_embedding == "alibi"
    assert entry("Llama-3.1-405B").kv_heads == 8


def test_mixtral_8x22b_matches_its_published_config():
    m = entry("Mixtral-8x22B")
    published = {"num_hidden_layers": 56, "hidden_size": 6144, "intermediate_size": 16384, "num_attention_heads": 48,
                     "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                     "max_position_embeddings": 65536}
    ours = {"num_hidden_layers": m.num_layers, "hidden_size": m.hidden_size, "intermediate_size": m.expert_ffn,
                "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.kv_heads,
                "num_local_experts": m.num_experts, "num_experts_per_tok": m.experts_top_k,
                "max_position_embeddings": m.max_sequence_length}
    assert ours == published
    assert m.vocab_size in (32000, 32768) and not m.tied_embeddings and m.mlp == "swiglu"


# ---- GPUs -------------------------------------------------------------------------------------------

# name -> (memory GB, dense bf16 TFLOPS, dense fp8 TFLOPS, HBM GB/s, per-GPU link GB/s)
NEW_GPUS = {
    "H100-NVL-94GB": (94, 835, 1670, 3900, 128),
    "GB200": (186, 2500, 5000, 8000, 1800),
    "MI325X": (256, 1307.4, 2614.9, 6000, 896),
}
FP8_DENSE = {"L4": 242.5, "L40S": 733, "H100-SXM5-80GB": 1979, "H100-PCIE-80GB": 1513, "H800-SXM5-80GB": 1979,
             "H20": 296, "H200-SXM-141GB": 1979, "GH200-96GB": 1979, "B200": 4500, "MI300X": 2614.9}


@pytest.mark.parametrize("name", sorted(NEW_GPUS))
def test_new_gpus(name):
    gpu = gpu_catalog().get(name)
    assert gpu is not None and gpu.name == name
    mem, bf16, fp8, hbm, link = NEW_GPUS[name]
    assert (gpu.memory_gb, gpu.peak_tflops, gpu.fp8_tflops, gpu.memory_bandwidth_gbps, gpu.intra_node_gbps) == (
        mem, bf16, fp8, hbm, link)
    assert gpu.inter_node_gbps > 0 and gpu.source


@pytest.mark.parametrize("name", sorted(FP8_DENSE))
def test_fp8_rates_of_existing_gpus(name):
    assert gpu_catalog().get(name).fp8_tflops == FP8_DENSE[name]


def test_fp8_is_dense_twice_bf16_and_absent_before_hopper_and_ada():
    """Every FP8 rate is the dense one: twice the dense bf16 rate on Ada, Hopper, Blackwell and CDNA3
    (a sparse figure would be four times). GPUs without FP8 tensor cores have none."""
    with_fp8 = {"ada", "hopper", "blackwell", "cdna3"}
    for gpu in gpu_catalog().gpus:
        if gpu.generation in with_fp8:
            assert gpu.fp8_tflops is not None, gpu.name
            assert gpu.fp8_tflops == pytest.approx(2 * gpu.peak_tflops, rel=0.03), gpu.name
            assert "FP8" in gpu.source or "fp8_tflops" in gpu.uncertain, gpu.name
        else:
            assert gpu.fp8_tflops is None, gpu.name


def test_peak_flops_fp8():
    assert gpu_catalog().get("H100").peak_flops("fp8") == 1979 * TFLOPS
    assert gpu_catalog().get("H100").peak_flops("bf16") == 989 * TFLOPS       # unchanged
    with pytest.raises(ValueError, match="A100-SXM4-40GB has no FP8"):
        gpu_catalog().get("A100-40").peak_flops("fp8")


def custom_cluster(fp8):
    gpu_type = {"name": "MyAccel", "memory_gb": 48, "peak_tflops": 100, "memory_bandwidth_gbps": 900,
                "intra_node_gbps": 64, "inter_node_gbps": 12.5, "fp8_tflops": fp8}
    return cluster_from_dict({"name": "c", "nodes": [{"name": "n", "gpu": "MyAccel", "gpus_per_node": 2}],
                              "gpu_types": [gpu_type]}, "c.yaml")


@given(st.floats(min_value=1e-3, max_value=1e5, allow_nan=False))
def test_cluster_gpu_types_may_declare_an_fp8_rate(rate):
    assert custom_cluster(rate).device("n:0").gpu.peak_flops("fp8") == pytest.approx(rate * TFLOPS)


@given(st.one_of(st.floats(max_value=1e-3, exclude_max=True, allow_nan=False),
                 st.floats(min_value=1e5, exclude_min=True, allow_nan=False), st.just("fast")))
def test_bad_fp8_rate_names_file_and_field(rate):
    with pytest.raises(InputError) as info:
        custom_cluster(rate)
    assert info.value.field == "gpu_types[0].fp8_tflops"
    assert str(info.value).startswith("c.yaml: gpu_types[0].fp8_tflops:") and "\n" not in str(info.value)


def test_catalog_page_lists_every_entry():
    text = DOCS.read_text()
    for name in [*gpu_catalog().names(), *model_catalog().names()]:
        assert f"| {name} |" in text, f"docs/catalog.md has no table row for {name}"
