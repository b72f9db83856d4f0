"""Selective recomputation of chosen modules (``recompute_modules``, Megatron-Core's ``--recompute-modules``):
the bytes each module's dropped activations take in a block, and the forward seconds of running those modules
again in backward. The bytes are terms of the per-operation activation count (:func:`memory.block_activation_terms`,
checked against autograd's saved tensors by ``python -m benchmarks cost-model activations``); sources and what is
ignored: docs/cost-model.md, "Recomputed modules"."""

from __future__ import annotations

from arachne.cost.compute import ComputeModel, act_bytes, core_precision, eager_extra_bytes
from arachne.cost.moe_layer import expert_gemms, moe_extra_bytes
from arachne.spec.gpus import GPUType
from arachne.spec.model import ModelSpec

DEFAULT_MODULES = ("core_attn",)
"""What ``recompute: "selective"`` recomputes when the stage names no modules."""


def separate_norms(model: ModelSpec, index: int) -> int:
    """Norms of block ``index`` that run as modules of their own in Megatron-Core's Transformer Engine layer spec,
    so that ``layernorm`` recomputation can drop their outputs: the pre-MLP norm of an MoE block (the router and the
    dispatcher read it), the input norm under MLA (its down projections read it). The other norms are fused into the
    next GEMM (``TELayerNormColumnParallelLinear``), where ``layernorm`` recomputation does nothing."""
    return int(bool(model.moe_layers[index])) + int(model.attention == "mla")


def _routed_fc2_width(model: ModelSpec) -> int:
    """Per-token elements of the routed experts' fc2 input (one intermediate width per chosen expert)."""
    return model.experts_top_k * model.expert_ffn


def _shared_width(model: ModelSpec) -> int:
    return model.shared_expert_ffn_hidden_size or model.expert_ffn * model.num_shared_experts


def dropped_bytes(model: ModelSpec, index: int, seq: int, b: float, tp: int, precision: str, sp: bool,
                  etp: int | None, modules: tuple[str, ...]) -> float:
    """Bytes of block ``index``'s saved activations (``b`` sequences) that ``modules`` drop, as the per-operation
    count keeps them (core attention aside: its score term is dropped by :func:`features.block_acts_v2`).

    ``layernorm``: each separate norm's output (``h`` per token; in fp8 the count already keeps it at 1 byte as
    the next GEMM's fp8 input, so ``h (ab - 1)``), split over tp with sequence parallelism. ``mla_up_proj``: the up
    projections' outputs q, k and v (flash attention's saved inputs; its output, the output projection's input,
    stays). ``moe_act``: the routed experts' fc2 input (``k f``). ``shared_experts``: the shared experts' MLP.
    ``mlp``: a dense block's whole MLP. ``moe``: an MoE block's whole expert part (``moe_act``, the shared experts
    and the dispatched tokens in and out)."""
    ab = act_bytes(precision)
    tok = seq * b
    h = model.hidden_size
    mods = set(modules)
    moe = model.moe_layers[index]
    out = 0.0
    if "layernorm" in mods:
        per = ab - 1 if precision == "fp8" else ab
        out += tok * separate_norms(model, index) * h * per / (tp if sp and tp > 1 else 1)
    if "mla_up_proj" in mods and model.attention == "mla":
        a = model.num_attention_heads
        out += tok * (2 * a * model.head_dim + a * model.v_dim) * ab / tp
    if moe:
        k = model.experts_top_k
        if "moe" in mods:
            width = k * model.expert_ffn * model.mlp_matrices + 2 * k * h * (1 if etp is None else etp / tp)
            if model.num_shared_experts:
                width += _shared_width(model) * model.mlp_matrices
            out += tok * width * ab / tp
        else:
            if "moe_act" in mods:
                out += tok * _routed_fc2_width(model) * ab / tp
            if "shared_experts" in mods and model.num_shared_experts:
                out += tok * _shared_width(model) * model.mlp_matrices * ab / tp
    elif "mlp" in mods:
        out += tok * model.ffn_hidden_size * model.mlp_matrices * ab / tp
    return out


def modules_fwd(compute: ComputeModel, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                ep: int, etp: int | None, sp: bool, modules: tuple[str, ...], a: int, z: int,
                attention_core_fwd: float, moe_kernels: str | None = None) -> float:
    """Forward seconds of recomputing ``modules`` in blocks ``[a, z)`` (the terms of
    :meth:`ComputeModel.analytic_block` for those parts, ``moe_kernels`` the MoE layer's implementation;
    collectives are added by the caller).

    ``core_attn``: the attention core (``attention_core_fwd`` per block). ``layernorm``: each separate norm reads
    and writes ``h`` per token. ``moe_act``: the activation reads its input and writes the fc2 input. ``mla_up_proj``:
    the query and key/value up-projection GEMMs. ``mlp`` / ``moe`` / ``shared_experts``: their GEMMs and
    element-wise work."""
    mods = set(modules)
    peak = compute.gemm_peak(gpu, precision)
    hbm = gpu.hbm_bandwidth
    ab = act_bytes(precision)
    tok = b * seq
    h, mats = model.hidden_size, model.mlp_matrices
    launch = compute.cal.kernel_launch_s
    up = sum(compute._gemm(2 * tok * i * o / tp, peak) for i, o, split in model.attention_gemms
             if split and i != h and o != h) if "mla_up_proj" in mods and model.attention == "mla" else 0.0
    total = 0.0
    for i in range(a, z):
        moe = model.moe_layers[i]
        t = attention_core_fwd if "core_attn" in mods else 0.0
        if "layernorm" in mods and (n := separate_norms(model, i)):
            t += n * 2 * tok * h * ab / (tp if sp and tp > 1 else 1) / hbm + n * launch
        t += up
        if moe:
            k = model.experts_top_k
            if "moe" in mods:  # the experts, the router (bf16 under fp8) and the layer's traffic (moe_layer.py)
                t += expert_gemms(lambda f: compute._gemm(f, peak), model, tok, tp, ep, etp)
                t += moe_extra_bytes(model, tok, tp, ep, etp, ab, moe_kernels)[0] / hbm
                t += compute._gemm(2 * tok * h * model.num_experts, compute.gemm_peak(gpu, core_precision(precision)))
            elif "moe_act" in mods:
                t += tok * k * model.expert_ffn * mats * ab / tp / hbm + launch
            if ("moe" in mods or "shared_experts" in mods) and model.num_shared_experts:
                t += mats * compute._gemm(2 * tok * h * _shared_width(model) / tp, peak)
        elif "mlp" in mods:
            t += mats * compute._gemm(2 * tok * h * model.ffn_hidden_size / tp, peak)
            t += 2 * tok * model.ffn_hidden_size / tp * ab * mats / hbm
        total += t
    return total


def recomputed_collectives(model: ModelSpec, modules: tuple[str, ...], a: int, z: int) -> tuple[int, int]:
    """(blocks whose MLP or MoE layer's forward tp collective runs again, MoE blocks whose all-to-alls run again):
    ``mlp`` recomputes a dense block's MLP with its collective, ``moe`` an MoE layer with its dispatch and combine."""
    mods = set(modules)
    moe = sum(model.moe_layers[a:z]) if "moe" in mods else 0
    dense = (z - a - sum(model.moe_layers[a:z])) if "mlp" in mods else 0
    return dense + moe, moe


def torchtitan_gemms(model: ModelSpec) -> list[tuple[int, int, bool]]:
    """A dense block's Linear GEMMs as torchtitan runs them, in execution order, as ``(in, out, split_by_tp)``:
    separate q, k, v and output projections (``mha``; MLA's as :attr:`ModelSpec.attention_gemms`), then the MLP's
    ``w1``, ``w3`` (gated) and ``w2``."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.attention == "mha":
        kv = model.kv_heads
        gemms = [(h, a * model.head_dim, True), (h, kv * model.head_dim, True), (h, kv * model.v_dim, True),
                 (a * model.v_dim, h, True)]
    else:
        gemms = list(model.attention_gemms)
    f = model.ffn_hidden_size
    return gemms + [(h, f, True)] * (model.mlp_matrices - 1) + [(f, h, True)]


def op_selective_fwd(compute: ComputeModel, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float,
                     tp: int, eager: str | None = None) -> float:
    """Forward seconds one dense block runs again in backward under torchtitan's op-level selective checkpointing
    (``recompute: "selective"`` under the ``torch`` convention; ``_apply_ac_to_transformer_block``, torchtitan
    2024-12 to 2026): the output of every second ``mm`` in execution order is dropped (k, the output projection
    and ``w3`` of a Llama block) and recomputed, and so is everything that is not a matmul or attention (norms,
    rotary, the activation): the block's whole element-wise forward. Attention's output is kept. The memory side is
    :func:`memory.torch_selective_bytes`; an MoE block is priced as its dense part (docs/cost-model.md).
    ``eager``: the element-wise ops run as eager kernels (:func:`~.compute.eager_extra_bytes` in that mode,
    forward)."""
    peak = compute.gemm_peak(gpu, precision)
    tok = b * seq
    c = compute.cal
    gemm = sum(compute._gemm(2 * tok * i * o / (tp if split else 1), peak)
               for n, (i, o, split) in enumerate(torchtitan_gemms(model)) if n % 2 == 1)
    h, ab = model.hidden_size, act_bytes(precision)
    elem = c.elementwise_passes * tok * h * ab * (c.replicated_fraction + (1 - c.replicated_fraction) / tp)
    elem += 2 * tok * model.ffn_hidden_size / tp * ab * model.mlp_matrices
    if eager is not None and precision != "fp32":
        elem += eager_extra_bytes(model, tok, tp, eager)[0]
    return gemm + elem / gpu.hbm_bandwidth + c.kernel_launch_s * c.kernels_per_block_fwd
