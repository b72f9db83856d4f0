"""Every tensor a runtime module holds lives on its ParamStore's device (a GPU run failed on a CPU buffer)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from arachne.runtime.model import LOCAL, Block, Embedding, Head, ParamStore  # noqa: E402
from arachne.spec.model import model_from_dict  # noqa: E402

pytestmark = pytest.mark.torch

GQA_MOE = {"name": "device-check", "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128,
           "num_attention_heads": 8, "num_kv_heads": 2, "vocab_size": 100, "max_sequence_length": 64,
           "num_experts": 4, "experts_top_k": 2, "moe_layer_frequency": 2, "num_shared_experts": 1,
           "mlp": "swiglu", "bias": False, "position_embedding": "rope"}


@pytest.mark.parametrize("doc", [GQA_MOE, GQA_MOE | {"num_kv_heads": 8, "bias": True, "mlp": "gelu",
                                                     "num_experts": None, "experts_top_k": None,
                                                     "moe_layer_frequency": None, "num_shared_experts": None}])
def test_modules_keep_every_tensor_on_the_store_device(doc):
    model = model_from_dict({k: v for k, v in doc.items() if v is not None}, "test")
    device = torch.device("meta")  # stands in for a GPU: any tensor made on the CPU by default shows up
    store = ParamStore(model, 0, device)
    mods = [Embedding(model, store), Block(model, 0, store, LOCAL, LOCAL), Block(model, 1, store, LOCAL, LOCAL),
            Head(model, store, LOCAL)]
    off = [(type(m).__name__, n) for m in mods for n, t in [*m.named_parameters(), *m.named_buffers()]
           if t.device != device]
    assert off == []
    assert any(n.endswith("kv_index") for n, _ in mods[1].named_buffers())  # the buffer that was on the CPU


def test_step_records_carry_peak_memory_only_when_measured():
    from arachne.runtime.launch import StepRecord

    assert "peak_memory_bytes" not in StepRecord(0, 7.5, 0.1).to_dict()  # CPU runs: as before
    assert StepRecord(0, 7.5, 0.1, 4.0e9).to_dict()["peak_memory_bytes"] == 4.0e9
