"""Cluster, GPU catalog and model specs: formats v1 sections 1 and 2."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arachne.errors import InputError, load_document
from arachne.plan import load_plan
from arachne.spec.cluster import cluster_from_dict, load_cluster
from arachne.spec.gpus import GB, gpu_catalog
from arachne.spec.model import ModelSpec, load_model, model_catalog

CUSTOM = {"name": "MyAccel-48GB", "memory_gb": 48, "peak_tflops": 180, "memory_bandwidth_gbps": 960,
          "intra_node_gbps": 64, "inter_node_gbps": 12.5}

FORMATS_EXAMPLE = {
    "name": "a100-v100-mix",
    "nodes": [
        {"name": "a100-{i}", "count": 2, "gpu": "A100-SXM4-40GB", "gpus_per_node": 8, "inter_node_gbps": 25},
        {"name": "v100-{i}", "count": 4, "gpu": "V100-SXM2-16GB", "gpus_per_node": 4},
    ],
    "gpu_types": [CUSTOM],
}


def expect_input_error(fn, *args, field: str | None = None, contains: tuple[str, ...] = ()) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args)
    err = info.value
    if field is not None:
        assert err.field == field, str(err)
        assert field in str(err)
    for text in contains:
        assert text in str(err), str(err)
    return err


# ---- clusters: parsing ------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_formats_example_cluster_loads_from_yaml_and_json(write_doc, suffix):
    cluster = load_cluster(write_doc("cluster" + suffix, FORMATS_EXAMPLE))
    assert cluster.name == "a100-v100-mix"
    assert [n.name for n in cluster.nodes] == ["a100-0", "a100-1", "v100-0", "v100-1", "v100-2", "v100-3"]
    assert cluster.num_gpus == 2 * 8 + 4 * 4
    assert cluster.gpu_counts == {"A100-SXM4-40GB": 16, "V100-SXM2-16GB": 16}
    assert "a100-1:7" in cluster.devices and "a100-1:8" not in cluster.devices
    assert "v100-3:3" in cluster.devices and "v100-3:4" not in cluster.devices
    dev = cluster.device("v100-2:1")
    assert (dev.node.name, dev.local_index, dev.gpu.name) == ("v100-2", 1, "V100-SXM2-16GB")
    assert [n.index for n in cluster.nodes] == list(range(6))


def test_yaml_written_by_hand_with_comments_and_flow_style(write_doc):
    text = """
# a comment
name: hand
nodes:
  - {name: "gh-{i}", count: 3, gpu: gh-96}   # quoted because of the braces
  - name: solo
    gpu: t4
    gpus_per_node: 2
"""
    cluster = load_cluster(write_doc("c.yaml", text))
    assert [n.name for n in cluster.nodes] == ["gh-0", "gh-1", "gh-2", "solo"]
    assert cluster.nodes[0].num_gpus == 4          # GH200 default: 4 per node
    assert cluster.nodes[3].num_gpus == 2


def test_i_expansion_everywhere_in_the_name():
    c = cluster_from_dict({"nodes": [{"name": "rack{i}-node{i}", "count": 3, "gpu": "T4", "gpus_per_node": 1}]})
    assert [n.name for n in c.nodes] == ["rack0-node0", "rack1-node1", "rack2-node2"]
    c = cluster_from_dict({"nodes": [{"name": "x-{i}", "gpu": "T4"}]})   # count defaults to 1
    assert [n.name for n in c.nodes] == ["x-0"]


def test_count_above_one_without_i_is_rejected():
    doc = {"nodes": [{"name": "a", "gpu": "T4"}, {"name": "b", "count": 2, "gpu": "T4"}]}
    expect_input_error(cluster_from_dict, doc, "c.yaml", field="nodes[1].name", contains=("c.yaml", "{i}"))


@pytest.mark.parametrize("nodes", [
    [{"name": "a", "gpu": "T4"}, {"name": "a", "gpu": "L4"}],
    [{"name": "n-{i}", "count": 2, "gpu": "T4"}, {"name": "n-1", "gpu": "T4"}],
    [{"name": "{i}", "count": 3, "gpu": "T4"}, {"name": "x{i}", "count": 2, "gpu": "T4"}, {"name": "2", "gpu": "A10"}],
])
def test_duplicate_node_names_are_rejected(nodes):
    err = expect_input_error(cluster_from_dict, {"nodes": nodes}, "c.yaml", contains=("duplicate node name",))
    assert err.field == f"nodes[{len(nodes) - 1}].name"


def test_unknown_gpu_names_the_field_and_the_gpu(write_doc):
    doc = copy.deepcopy(FORMATS_EXAMPLE)
    doc["nodes"][1]["gpu"] = "V100-SXM9-999GB"
    path = write_doc("bad.yaml", doc)
    expect_input_error(load_cluster, path, field="nodes[1].gpu", contains=(str(path), "V100-SXM9-999GB"))


def test_node_names_with_colon_are_rejected():
    expect_input_error(cluster_from_dict, {"nodes": [{"name": "a:b", "gpu": "T4"}]}, field="nodes[0].name")


def test_custom_gpu_type_is_resolved_case_insensitively():
    doc = {"nodes": [{"name": "x-{i}", "count": 2, "gpu": "myaccel-48gb", "gpus_per_node": 4},
                     {"name": "t", "gpu": "T4"}],
           "gpu_types": [CUSTOM]}
    c = cluster_from_dict(doc)
    gpu = c.nodes[0].gpu
    assert gpu.name == "MyAccel-48GB"
    assert gpu.memory_bytes == 48 * 2**30 and gpu.peak_flops("bf16") == 180e12
    assert gpu.hbm_bandwidth == 960 * GB
    assert c.nodes[0].inter_node_bw == 12.5 * GB
    assert c.gpu_counts == {"MyAccel-48GB": 8, "T4": 4}
    # the catalog itself is not modified
    assert gpu_catalog().get("MyAccel-48GB") is None


def test_custom_gpu_type_overrides_a_catalog_name():
    doc = {"nodes": [{"name": "a", "gpu": "A100-40", "gpus_per_node": 2}],
           "gpu_types": [dict(CUSTOM, name="A100-40", memory_gb=44)]}
    assert cluster_from_dict(doc).nodes[0].gpu.memory_gb == 44


def test_custom_gpu_type_with_bad_figures_is_rejected():
    doc = {"nodes": [{"name": "a", "gpu": "MyAccel-48GB"}], "gpu_types": [dict(CUSTOM, memory_gb=0)]}
    expect_input_error(cluster_from_dict, doc, "c.yaml", field="gpu_types[0].memory_gb")
    doc = {"nodes": [{"name": "a", "gpu": "MyAccel-48GB"}], "gpu_types": [{"name": "MyAccel-48GB"}]}
    expect_input_error(cluster_from_dict, doc, contains=("gpu_types[0]", "required field is missing"))


SAILOR_ALIASES = {
    "GH-96": "GH200-96GB", "A100-40": "A100-SXM4-40GB", "A100-80": "A100-SXM4-80GB",
    "V100-16": "V100-SXM2-16GB", "RTX-2080": "RTX-2080-Ti", "Titan-RTX": "Titan-RTX", "RTX-3090": "RTX-3090",
}


@pytest.mark.parametrize("alias,name", sorted(SAILOR_ALIASES.items()))
@pytest.mark.parametrize("case", [str, str.lower, str.upper, str.swapcase])
def test_sailor_gpu_names_are_case_insensitive_aliases(alias, name, case):
    c = cluster_from_dict({"nodes": [{"name": "n", "gpu": case(alias)}]})
    assert c.nodes[0].gpu.name == name


@pytest.mark.parametrize("alias,name", [
    ("A100-SXM4-80GB", "A100-SXM4-80GB"), ("V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("H100-SXM5-80GB", "H100-SXM5-80GB"), ("A100-PCIE-40GB", "A100-PCIE-40GB"),
    ("A100-80", "A100-SXM4-80GB"), ("A100-40", "A100-SXM4-40GB"), ("V100-16", "V100-SXM2-16GB"),
    ("V100-32", "V100-SXM2-32GB"), ("H100", "H100-SXM5-80GB"), ("H800", "H800-SXM5-80GB"),
    ("A800", "A800-SXM4-80GB"), ("H200", "H200-SXM-141GB"), ("GH200", "GH200-96GB"), ("A10", "A10"),
    ("A10G", "A10G"), ("L4", "L4"), ("L40S", "L40S"), ("T4", "T4"), ("P100", "P100-PCIE-16GB"),
    ("RTX-3090", "RTX-3090"), ("RTX-4090", "RTX-4090"), ("h100_sxm5_80gb", "H100-SXM5-80GB"),
])
def test_formats_v1_gpu_names_resolve(alias, name):
    assert gpu_catalog().get(alias).name == name


def test_inter_node_bandwidth_override_and_defaults():
    doc = {"nodes": [{"name": "fast", "gpu": "RTX-3090", "inter_node_gbps": 3.125},
                     {"name": "slow", "gpu": "RTX-3090"}]}
    c = cluster_from_dict(doc)
    fast, slow = c.nodes
    assert fast.inter_node_bw == pytest.approx(3.125 * GB)
    assert slow.inter_node_bw == pytest.approx(gpu_catalog().get("RTX-3090").inter_node_gbps * GB)
    assert fast.num_gpus == slow.num_gpus == gpu_catalog().get("RTX-3090").gpus_per_node


@pytest.mark.parametrize("doc,field", [
    ({}, "nodes"),
    ({"nodes": []}, "nodes"),
    ({"nodes": "gpu"}, "nodes"),
    ({"nodes": [None]}, "nodes[0]"),
    ({"nodes": [{"gpu": "T4"}]}, "nodes[0].name"),
    ({"nodes": [{"name": "a"}]}, "nodes[0].gpu"),
    ({"nodes": [{"name": "a", "gpu": "T4", "count": 0}]}, "nodes[0].count"),
    ({"nodes": [{"name": "a", "gpu": "T4", "gpus_per_node": 0}]}, "nodes[0].gpus_per_node"),
    ({"nodes": [{"name": "a", "gpu": "T4", "inter_node_gbps": -1}]}, "nodes[0].inter_node_gbps"),
    ({"nodes": [{"name": "a", "gpu": "T4", "gpus": 4}]}, "nodes[0].gpus"),
    ({"nodes": [{"name": "a", "gpu": "T4"}], "extra": 1}, "extra"),
])
def test_structural_errors_name_the_field(doc, field):
    expect_input_error(cluster_from_dict, doc, "c.yaml", field=field, contains=("c.yaml",))


# ---- malformed files ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,text,reason", [
    ("c.yaml", "nodes: [\n  {name: a, gpu: T4\n", "invalid YAML"),
    ("c.yaml", "nodes:\n  - name: a\n   gpu: T4\n  bad", "invalid YAML"),
    ("c.json", '{"nodes": [}', "invalid JSON"),
    ("c.json", "", "invalid JSON"),
    ("c.yaml", "- just\n- a list\n", "mapping"),
    ("c.json", "[1, 2]", "mapping"),
    ("c.yaml", "", "mapping"),
])
@pytest.mark.parametrize("loader", [load_cluster, load_plan, load_model, load_document])
def test_malformed_documents_raise_input_error_naming_the_file(write_doc, name, text, reason, loader):
    path = write_doc(name, text)
    err = expect_input_error(loader, str(path), contains=(str(path), reason))
    assert "\n" not in str(err)


def test_missing_file_and_directory_raise_input_error(tmp_path):
    expect_input_error(load_cluster, tmp_path / "nope.yaml", contains=("nope.yaml", "not found"))
    expect_input_error(load_cluster, tmp_path, contains=("directory",))


def test_bad_utf8_raises_input_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    expect_input_error(load_cluster, path, contains=(str(path),))


# ---- GPU catalog ----------------------------------------------------------------------------------

# (lookup name, memory GB, dense bf16/fp16 TFLOPS) for every GPU in docs/catalog.md
CATALOG_MD_GPUS = [
    ("V100-SXM2-16GB", 16, 125), ("V100-SXM2-32GB", 32, 125), ("A100-SXM4-40GB", 40, 312),
    ("A100-SXM4-80GB", 80, 312), ("A100-PCIE-40GB", 40, 312), ("A100-PCIE-80GB", 80, 312),
    ("H100-SXM5-80GB", 80, 989), ("H100-PCIE-80GB", 80, 756), ("H200", 141, 989), ("GH200", 96, 989),
    ("H20", 96, 148), ("L4", 24, 121), ("L40S", 48, 362), ("A10G", 24, None), ("A10", 24, 125),
    ("T4", 16, 65), ("RTX-3090", 24, 71), ("RTX-4090", 24, 165.2), ("RTX-2080-Ti", 11, 53.8),
    ("Titan-RTX", 24, 130), ("MI250X", 128, 383), ("MI300X", 192, 1307), ("B200", 180, 2250),
    ("P100", 16, 19), ("A800", 80, 312), ("H800", 80, 989),
]


@pytest.mark.parametrize("name,memory_gb,tflops", CATALOG_MD_GPUS)
def test_gpu_catalog_has_every_gpu_of_catalog_md(name, memory_gb, tflops):
    gpu = gpu_catalog().get(name)
    assert gpu is not None, name
    assert gpu.memory_gb == pytest.approx(memory_gb, rel=0.01)
    if tflops is not None:
        assert gpu.peak_tflops == pytest.approx(tflops, rel=0.01)
    for value in (gpu.memory_bandwidth_gbps, gpu.intra_node_gbps, gpu.inter_node_gbps):
        assert value > 0 and math.isfinite(value)


def test_gpus_without_bf16_are_marked():
    for name in ("V100-16", "V100-32", "T4", "P100", "RTX-2080", "Titan-RTX"):
        assert gpu_catalog().get(name).bf16 is False, name
    for name in ("A100-40", "H100", "GH-96", "L4", "RTX-3090", "RTX-4090"):
        assert gpu_catalog().get(name).bf16 is True, name


def test_gpu_catalog_names_and_aliases_are_unambiguous():
    from arachne.spec.gpus import normalize_name
    owner: dict[str, str] = {}
    for gpu in gpu_catalog().gpus:
        for key in (gpu.name, *gpu.aliases):
            k = normalize_name(key)
            assert owner.setdefault(k, gpu.name) == gpu.name, f"{key!r} names {owner[k]} and {gpu.name}"


# ---- model catalog ----------------------------------------------------------------------------------

# name -> (published total parameters, relative tolerance, published active parameters or None)
PUBLISHED_PARAMS = {
    # the catalog does not model OPT-350M's 512-d word projection (see models.yaml): 356M vs 331M
    "OPT-350M": (331e6, 0.08, None),
    "GPT-Neo-2.7B": (2.65e9, 0.01, None),
    "GPT-3-1.3B": (1.3e9, 0.03, None),
    "GPT-3-2.7B": (2.7e9, 0.03, None),
    "GPT-3-6.7B": (6.7e9, 0.03, None),
    "GPT-3-13B": (13.0e9, 0.03, None),
    "LLaMA-2-7B": (6.74e9, 0.01, None),
    "LLaMA-2-13B": (13.02e9, 0.01, None),
    "LLaMA-2-70B": (68.98e9, 0.01, None),
    "LLaMA-3-8B": (8.03e9, 0.01, None),
    "LLaMA-3-70B": (70.55e9, 0.01, None),
    "Mixtral-8x7B": (46.7e9, 0.01, 12.9e9),
    "Mixtral-8x22B": (141e9, 0.01, 39e9),
    "DeepSeek-MoE-16B": (16.4e9, 0.01, 2.8e9),
    "Qwen1.5-MoE-A2.7B": (14.3e9, 0.01, 2.7e9),
    "Qwen2-57B-A14B": (57.4e9, 0.01, 14.2e9),
}


def catalog_entry(name: str) -> ModelSpec:
    found = [m for m in model_catalog().models if m.name == name]
    assert len(found) == 1, f"{name} is not (exactly once) in the model catalog"
    return found[0]


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_model_catalog_parameter_counts_match_published(name):
    total, rel, active = PUBLISHED_PARAMS[name]
    model = catalog_entry(name)
    assert model.num_params == pytest.approx(total, rel=rel)
    if active is not None:
        assert model.is_moe
        assert model.active_params == pytest.approx(active, rel=0.02)
    else:
        assert not model.is_moe and model.active_params == model.num_params


def test_model_catalog_shapes():
    mixtral = catalog_entry("Mixtral-8x7B")
    assert (mixtral.num_experts, mixtral.experts_top_k, mixtral.kv_heads) == (8, 2, 8)
    assert all(mixtral.moe_layers)
    deepseek = catalog_entry("DeepSeek-MoE-16B")
    assert deepseek.moe_layers[0] is False and all(deepseek.moe_layers[1:])
    assert catalog_entry("LLaMA-2-70B").kv_heads == 8
    assert catalog_entry("OPT-350").num_params == 407431168       # Sailor's count (models.json)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_model_lookup_by_name_is_case_insensitive(name):
    for ref in (name, name.lower(), name.upper()):
        assert load_model(ref).name == name


def test_gpt3_1_3b_and_13b_are_distinct_lookups():
    # regression: punctuation-insensitive keys once made 'GPT-3-1.3B' find GPT-3-13B
    assert load_model("GPT-3-1.3B").num_layers == load_model("gpt3-1.3b").num_layers == 24
    assert load_model("GPT-3-13B").num_layers == load_model("gpt3-13b").num_layers == 40
    assert load_model("gpt-3-xl").name == "GPT-3-1.3B"


def test_model_names_are_unambiguous_after_normalisation():
    from arachne.spec.gpus import normalize_name
    owner: dict[str, str] = {}
    for m in model_catalog().models:
        for key in (m.name, *m.aliases):
            k = normalize_name(key)
            assert owner.setdefault(k, m.name) == m.name, f"{key!r} names {owner[k]} and {m.name}"


INLINE = {"name": "my-moe", "num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 512,
          "num_attention_heads": 8, "num_kv_heads": 2, "vocab_size": 1000, "max_sequence_length": 512,
          "num_experts": 4, "experts_top_k": 2, "moe_layer_frequency": 2, "tied_embeddings": False}


def test_inline_model_document():
    m = load_model(INLINE)
    assert m.is_moe and m.kv_heads == 2 and m.head_dim == 32
    assert m.moe_layers == (False, True, False, True)
    assert 0 < m.active_params < m.num_params


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_model_file(write_doc, suffix):
    path = write_doc("model" + suffix, INLINE)
    assert load_model(str(path)) == load_model(INLINE)


@pytest.mark.parametrize("change,field,reason", [
    ({"hidden_size": 250}, "model", "divisible"),
    ({"num_kv_heads": 3}, "model", "divisible"),
    ({"experts_top_k": 5}, "model", "experts_top_k"),
    ({"num_layers": 0}, "model.num_layers", "greater than"),
    ({"vocab_size": -5}, "model.vocab_size", "greater than"),
    ({"hidden_size": "big"}, "model.hidden_size", "integer"),
    ({"num_experts": None}, "model.num_experts", ""),
    ({"wat": 1}, "model.wat", "unknown field"),
])
def test_bad_inline_model_names_the_field(change, field, reason):
    expect_input_error(load_model, {**INLINE, **change}, "p.json", field=field, contains=("p.json", reason))


def test_missing_model_field_and_unknown_model():
    doc = dict(INLINE)
    del doc["vocab_size"]
    expect_input_error(load_model, doc, field="model.vocab_size", contains=("required field is missing",))
    expect_input_error(load_model, "gpt-17", "p.json", field="model", contains=("unknown model",))
    expect_input_error(load_model, "", field="model")


def test_bad_model_file_names_the_file(write_doc):
    path = write_doc("m.yaml", {**INLINE, "num_layers": -1})
    expect_input_error(load_model, str(path), contains=(str(path), "num_layers"))
    expect_input_error(load_model, str(path.with_name("missing.yaml")), contains=("missing.yaml", "not found"))


# ---- property tests ----------------------------------------------------------------------------------

GPU_REFS = sorted({k for g in gpu_catalog().gpus for k in (g.name, *g.aliases)})
NAME = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=8).filter(
    lambda s: not s.startswith(".") and ".." not in s)  # the safe-name rule (spec/names.py)


def _recase(text: str, flips: list[bool]) -> str:
    return "".join(c.swapcase() if f else c for c, f in zip(text, flips + [False] * len(text)))


@st.composite
def cluster_docs(draw):
    custom = draw(st.booleans())
    types = []
    refs = list(GPU_REFS)
    if custom:
        t = dict(CUSTOM,
                 name="Custom-" + draw(NAME),
                 memory_gb=draw(st.floats(1, 512)),
                 peak_tflops=draw(st.floats(1, 3000)),
                 inter_node_gbps=draw(st.floats(0.1, 400)),
                 gpus_per_node=draw(st.integers(1, 16)))
        types.append(t)
        refs.append(t["name"])
    groups = []
    for gi in range(draw(st.integers(1, 5))):
        count = draw(st.integers(1, 4))
        stem = f"g{gi}" + draw(NAME)
        name = stem + ("-{i}" if count > 1 or draw(st.booleans()) else "")
        ref = draw(st.sampled_from(refs))
        group = {"name": name, "count": count,
                 "gpu": _recase(ref, draw(st.lists(st.booleans(), max_size=len(ref))))}
        if draw(st.booleans()):
            group["gpus_per_node"] = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
        if draw(st.booleans()):
            group["inter_node_gbps"] = draw(st.floats(0.01, 1000))
        if draw(st.booleans()):
            group["zone"] = draw(NAME)
        groups.append(group)
    doc = {"name": draw(NAME), "nodes": groups}
    if types:
        doc["gpu_types"] = types
    return doc


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_docs())
def test_random_valid_clusters_round_trip(doc):
    cluster = cluster_from_dict(doc, "c.yaml")
    assert cluster.num_gpus == sum(n.num_gpus for n in cluster.nodes)
    assert len(cluster.nodes) == sum(g["count"] for g in doc["nodes"])
    spec = cluster.to_spec()
    again = cluster_from_dict(json.loads(json.dumps(spec)), "roundtrip.json")
    assert list(again.devices) == list(cluster.devices)
    for a, b in zip(cluster.nodes, again.nodes):
        assert (a.name, a.index, a.gpu, a.num_gpus, a.nics, a.zone) == (b.name, b.index, b.gpu, b.num_gpus, b.nics,
                                                                        b.zone)
        assert b.inter_node_bw == pytest.approx(a.inter_node_bw, rel=1e-12)
        assert b.intra_node_bw == pytest.approx(a.intra_node_bw, rel=1e-12)
    assert again.gpu_counts == cluster.gpu_counts


def test_round_trip_keeps_intra_node_override():
    c = cluster_from_dict({"nodes": [{"name": "a", "gpu": "A100-40", "intra_node_gbps": 100}]})
    assert cluster_from_dict(c.to_spec()).nodes[0].intra_node_bw == c.nodes[0].intra_node_bw


# never valid for a required number; ``None`` is only invalid where the field has no null default
NON_NUMBERS = st.one_of(st.integers(max_value=0), st.floats(max_value=0, allow_nan=False), st.just(float("nan")),
                        st.text("abxyz -", max_size=3), st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
BAD_NUMBERS = st.one_of(NON_NUMBERS, st.none())
BAD_STRINGS = st.one_of(st.just(""), st.integers(), st.none(), st.lists(st.text(), max_size=2), st.floats())


@st.composite
def invalid_cluster_docs(draw):
    doc = draw(cluster_docs())
    kind = draw(st.sampled_from(["count", "gpus_per_node", "inter_node_gbps", "gpu", "name", "gpu_type_figure",
                                 "gpu_type_name", "nodes", "unknown_gpu", "no_i", "duplicate", "extra_key",
                                 "node_entry", "colon"]))
    gi = draw(st.integers(0, len(doc["nodes"]) - 1))
    group = doc["nodes"][gi]
    if kind == "count":
        group[kind] = draw(BAD_NUMBERS)
    elif kind in ("gpus_per_node", "inter_node_gbps"):     # optional: null means "catalog default"
        group[kind] = draw(NON_NUMBERS)
    elif kind in ("gpu", "name"):
        group[kind] = draw(BAD_STRINGS)
    elif kind == "gpu_type_figure":
        field = draw(st.sampled_from(["memory_gb", "peak_tflops", "memory_bandwidth_gbps", "intra_node_gbps",
                                      "inter_node_gbps", "gpus_per_node"]))
        doc["gpu_types"] = [dict(CUSTOM, **{field: draw(BAD_NUMBERS)})]
    elif kind == "gpu_type_name":
        doc["gpu_types"] = [dict(CUSTOM, name=draw(BAD_STRINGS))]
    elif kind == "nodes":
        doc["nodes"] = draw(st.one_of(st.just([]), st.none(), st.text(max_size=3), st.integers()))
    elif kind == "unknown_gpu":
        group["gpu"] = "NoSuchGPU-" + draw(NAME)
    elif kind == "no_i":
        group["name"] = group["name"].replace("{i}", "")
        group["count"] = draw(st.integers(2, 5))
    elif kind == "duplicate":
        doc["nodes"].append({"name": group["name"].replace("{i}", "0"), "gpu": "T4"})
        if "{i}" in group["name"] or group["count"] == 1:
            pass
        else:  # pragma: no cover - names without {i} have count 1
            raise AssertionError
    elif kind == "extra_key":
        group[draw(st.sampled_from(["gpus", "GPU", "nodes", "type"]))] = 1
    elif kind == "node_entry":
        doc["nodes"][gi] = draw(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.lists(st.integers())))
    elif kind == "colon":
        group["name"] = "a:" + group["name"]
    return doc


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(invalid_cluster_docs())
def test_random_invalid_clusters_always_raise_input_error(doc):
    with pytest.raises(InputError) as info:
        cluster_from_dict(doc, "c.yaml")
    assert str(info.value).startswith("c.yaml: ")
    assert "\n" not in str(info.value)


def test_top_level_non_string_key_is_an_input_error(write_doc):
    path = write_doc("c.yaml", "name: c\n1: oops\nnodes:\n  - {name: a, gpu: T4}\n")
    with pytest.raises(InputError):
        load_cluster(path)


def test_a_gpu_type_declared_twice_is_refused_naming_the_second():
    lab = {"name": "Lab-GPU", "memory_gb": 24, "peak_tflops": 100, "memory_bandwidth_gbps": 900,
           "intra_node_gbps": 64, "inter_node_gbps": 25}
    doc = {"name": "c", "nodes": [{"name": "n", "gpu": "Lab-GPU", "gpus_per_node": 2}],
           "gpu_types": [lab, {**lab, "name": "lab_gpu", "peak_tflops": 50}]}
    with pytest.raises(InputError, match=r"gpu_types\[1\]\.name: 'lab_gpu' is declared twice"):
        cluster_from_dict(doc, "c.yaml")
    assert cluster_from_dict({**doc, "gpu_types": [lab]}, "c.yaml").num_gpus == 2
