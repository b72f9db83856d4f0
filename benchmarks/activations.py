"""``python -m benchmarks cost-model activations``: what autograd keeps for backward in one transformer
block, counted on a real torch forward on CPU, against the per-term count of arachne/cost/memory.py.

The block is built from torch ops in two styles. ``megatron`` mirrors Megatron-Core with Transformer
Engine: fused norm kernels that save their input and per-token statistics, a fused SwiGLU that saves only
its input (``bias_swiglu_impl``), flash attention with grouped K/V (no repeat). ``torch`` is a plain
``torch.nn`` Llama block as torchtitan writes it: ``nn.RMSNorm``, ``repeat_kv`` before attention,
``silu(w1 x) * w3 x``. Every tensor autograd saves is caught by ``torch.autograd.graph.saved_tensors_hooks``
and counted once per storage (views of one tensor count once); parameters are not activations.
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks import common

SEQ, BATCH = 256, 2


def _block(style: str, h: int, heads: int, kv: int, ffn: int, mlp: str, bias: bool, dropout: float,
           flash: bool):
    import torch
    import torch.nn.functional as F

    d = h // heads
    g = torch.Generator().manual_seed(0)

    def lin(i: int, o: int) -> tuple[Any, Any]:
        w = (torch.randn(o, i, generator=g) / math.sqrt(i)).bfloat16().requires_grad_()
        b = torch.zeros(o, dtype=torch.bfloat16, requires_grad=True) if bias else None
        return w, b

    class FusedRMSNorm(torch.autograd.Function):  # TE/Apex fused RMSNorm: saves input and 1/rms
        @staticmethod
        def forward(ctx, x, w):
            r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
            ctx.save_for_backward(x, w, r)
            return (x.float() * r).to(x.dtype) * w

        @staticmethod
        def backward(ctx, go):
            x, w, r = ctx.saved_tensors
            n = x.float() * r
            gw = (go.float() * n).sum((0, 1)).to(w.dtype)
            gn = go.float() * w.float()
            gx = r * (gn - n * (gn * n).mean(-1, keepdim=True))
            return gx.to(x.dtype), gw

    class FusedSwiGLU(torch.autograd.Function):  # Megatron bias_swiglu_impl: saves only its input
        @staticmethod
        def forward(ctx, y):
            ctx.save_for_backward(y)
            a, b = y.chunk(2, -1)
            return F.silu(a) * b

        @staticmethod
        def backward(ctx, go):
            (y,) = ctx.saved_tensors
            a, b = y.float().chunk(2, -1)
            s = torch.sigmoid(a)
            return torch.cat([go * b * s * (1 + a * (1 - s)), go * a * s], -1).to(y.dtype)

    nw1 = torch.ones(h, dtype=torch.bfloat16, requires_grad=True)
    nw2 = torch.ones(h, dtype=torch.bfloat16, requires_grad=True)
    nb1 = torch.zeros(h, dtype=torch.bfloat16, requires_grad=True) if bias else None
    nb2 = torch.zeros(h, dtype=torch.bfloat16, requires_grad=True) if bias else None
    wqkv, bqkv = lin(h, (heads + 2 * kv) * d)
    wo, bo = lin(h, h)
    gated = mlp == "swiglu"
    w1, b1 = lin(h, 2 * ffn if gated else ffn)
    w2, b2 = lin(ffn, h)
    params = [p for p in (nw1, nw2, nb1, nb2, wqkv, bqkv, wo, bo, w1, b1, w2, b2) if p is not None]
    torch_rms = torch.nn.RMSNorm(h, eps=1e-5).bfloat16()

    def norm(x, w, b):
        if bias:  # LayerNorm (GPT style): aten native_layer_norm saves input, mean, rstd
            return F.layer_norm(x, (h,), w, b)
        if style == "torch":
            torch_rms.weight = torch.nn.Parameter(w.detach(), requires_grad=True)
            params.append(torch_rms.weight)
            return torch_rms(x)
        return FusedRMSNorm.apply(x, w)

    def attention(x):
        if style == "torch":  # torchtitan: separate wq, wk, wv
            w_q, w_k, w_v = wqkv.split([heads * d, kv * d, kv * d], 0)
            q, k, v = (F.linear(x, w) for w in (w_q, w_k, w_v))
        else:  # Megatron: one fused QKV GEMM
            q, k, v = F.linear(x, wqkv, bqkv).split([heads * d, kv * d, kv * d], -1)
        q = q.view(BATCH, SEQ, heads, d).transpose(1, 2)
        k = k.view(BATCH, SEQ, kv, d).transpose(1, 2)
        v = v.view(BATCH, SEQ, kv, d).transpose(1, 2)
        if style == "torch" and kv != heads:  # torchtitan repeat_kv: K, V materialised at all heads
            k = k.repeat_interleave(heads // kv, 1)
            v = v.repeat_interleave(heads // kv, 1)
            gqa = False
        else:
            gqa = kv != heads
        if flash:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:  # the attention core written out: the score matrix and softmax are kept (fp32 path)
            if gqa:
                k = k.repeat_interleave(heads // kv, 1)
                v = v.repeat_interleave(heads // kv, 1)
            s = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            p = drop(torch.softmax(s.float(), -1).to(q.dtype))
            o = p @ v
        # Megatron's flash kernels write [s, b, heads, d]: the projection's input is a view of the output;
        # torchtitan transposes and copies (``.contiguous()``)
        return F.linear(o.transpose(1, 2).contiguous().view(BATCH, SEQ, h), wo, bo)

    def ffn_(x):
        if gated and style == "torch":  # torchtitan: w2(silu(w1 x) * w3 x), separate w1, w3
            wa, wc = w1.chunk(2, 0)
            y = F.silu(F.linear(x, wa)) * F.linear(x, wc)
        elif gated:
            y = FusedSwiGLU.apply(F.linear(x, w1, b1))
        else:
            y = F.gelu(F.linear(x, w1, b1))
        return F.linear(y, w2, b2)

    def drop(y):  # aten native_dropout keeps a bool mask, as the CUDA kernel does
        return torch.native_dropout(y, dropout, True)[0] if dropout else y

    def forward(x):
        x = x + drop(attention(norm(x, nw1, nb1)))
        return x + drop(ffn_(norm(x, nw2, nb2)))

    return forward, params


def saved_bytes(style: str, **shape: Any) -> float:
    """Bytes autograd keeps for backward after one forward of the block (one count per storage)."""
    import torch

    forward, params = _block(style, **shape)
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(BATCH, SEQ, shape["h"]).bfloat16().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(x)
    skip = {p.untyped_storage().data_ptr() for p in params}
    total = sum(n for ptr, n in seen.items() if ptr not in skip)
    out.float().sum().backward()  # the graph is whole: backward runs
    return float(total)


_F = False
CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama gqa swiglu", {"h": 512, "heads": 8, "kv": 2, "ffn": 1376, "mlp": "swiglu", "bias": False, "dropout": 0.0, "flash": True}),
    ("llama mha swiglu", {"h": 512, "heads": 8, "kv": 8, "ffn": 1376, "mlp": "swiglu", "bias": False, "dropout": 0.0, "flash": True}),
    ("gpt gelu bias", {"h": 512, "heads": 8, "kv": 8, "ffn": 2048, "mlp": "gelu", "bias": True, "dropout": 0.0, "flash": True}),
    ("gpt gelu drop", {"h": 512, "heads": 8, "kv": 8, "ffn": 2048, "mlp": "gelu", "bias": True, "dropout": 0.1, "flash": True}),
]


def _spec(name: str, s: dict[str, Any]):
    from arachne.spec.model import ModelSpec

    return ModelSpec(name=name.replace(" ", "-"), num_layers=1, hidden_size=s["h"], ffn_hidden_size=s["ffn"],
                     num_attention_heads=s["heads"], num_kv_heads=s["kv"], vocab_size=1000, mlp=s["mlp"],
                     bias=s["bias"], max_sequence_length=SEQ)


def run(a) -> None:
    from arachne.cost.calibration import DEFAULT_CALIBRATION
    from arachne.cost.memory import block_activation_bytes

    cal = DEFAULT_CALIBRATION.memory
    rows = []
    for name, shape in CASES:
        model = _spec(name, shape)
        h = shape["h"]
        korth = SEQ * BATCH * h * 34  # Korthikanti et al. eq. 1 (bf16, no tp), without the 5as/h score term
        for style in ("megatron", "torch"):
            if style == "torch" and shape["bias"]:
                continue  # the torch style is the torchtitan Llama block
            meas = saved_bytes(style, **shape)
            conv = "megatron" if style == "megatron" else "torch"
            pred = block_activation_bytes(model, 0, SEQ, BATCH, 1, "bf16", cal, convention=conv,
                                          dropout=shape["dropout"] > 0)
            rows.append({"block": name, "style": style, "measured_MB": meas / 1e6, "arachne_MB": pred / 1e6,
                         "err_pct": 100 * (pred - meas) / meas, "34sbh_MB": korth / 1e6})
    common.print_table(f"saved activations of one block, bf16, s={SEQ} b={BATCH} (torch CPU)", rows,
                       ["block", "style", "measured_MB", "arachne_MB", "err_pct", "34sbh_MB"])
    common.write_result(a.out, "activations", rows, {"max_abs_err_pct": max(abs(r["err_pct"]) for r in rows)},
                        {"seq": SEQ, "batch": BATCH}, benchmark="cost-model-activations")
