"""Memory per device: model state by precision and ZeRO, activations in flight, transients, overhead."""

from __future__ import annotations

from dataclasses import dataclass

from arachne.cost.calibration import MemoryCalibration
from arachne.cost.compute import act_bytes, uses_flash_attention
from arachne.spec.model import ModelSpec


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one device of a stage."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    transient: float
    overhead: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient + self.overhead


def stage_params(model: ModelSpec, a: int, b: int, first: bool, last: bool, num_stages: int,
                 tp: int, ep: int, etp: int | None = None) -> float:
    """Parameters held by one device of a stage (TP-sharded; routed experts EP- and ``etp``-sharded, ``etp``
    None: ``tp``)."""
    et = tp if etp is None else etp
    p = 0.0
    for i in range(a, b):
        expert, rep = model.block_expert_params(i), model.attention_replicated_params
        p += (model.block_params(i) - expert - rep) / tp + rep + expert / (et * ep)
    if first:
        p += model.embedding_params(tp) / tp
    if last:
        p += model.head_params(tp) / tp
        if model.tied_embeddings and num_stages > 1:
            p += model.padded_vocab(tp) * model.hidden_size / tp  # copy of the tied embedding
    return p


def stage_expert_params(model: ModelSpec, a: int, b: int, tp: int, ep: int, etp: int | None = None) -> float:
    """The routed-expert part of :func:`stage_params` (held by ``1/ep`` of the stage's groups)."""
    return sum(model.block_expert_params(i) for i in range(a, b)) / ((tp if etp is None else etp) * ep)


CONVENTIONS = ("megatron", "torch")
"""How a plan's 16-bit activations, model state and loss are accounted: ``megatron`` (Megatron-Core with
Transformer Engine's fused kernels) for ``zero_stage`` 0-2, ``torch`` (plain torch.nn blocks under FSDP, as
torchtitan and llm-foundry run them) for ``zero_stage`` 3 (docs/cost-model.md, "Memory per device")."""


def convention(zero_stage: int) -> str:
    """The accounting convention a plan's ``zero_stage`` selects: 3 (FSDP) -> ``torch``, else ``megatron``."""
    return "torch" if zero_stage >= 3 else "megatron"


def _ffn_split(model: ModelSpec, index: int, tp: int, etp: int | None, per_matrix: float) -> float:
    """Per-token elements the MLP (or MoE layer) keeps, split over tp: ``per_matrix`` times the intermediate
    width per MLP (the fp32 path's ``mats - 1``; 16-bit: the saved input of the activation function and of
    the second GEMM), plus, in an MoE block, the dispatched tokens in and out (``2 k h``)."""
    h = model.hidden_size
    if model.moe_layers[index]:
        k = model.experts_top_k
        ffn = k * model.expert_ffn * per_matrix + 2 * k * h * (1 if etp is None else etp / tp)
        if model.num_shared_experts:
            ffn += (model.shared_expert_ffn_hidden_size or model.expert_ffn * model.num_shared_experts) * per_matrix
        return ffn
    return model.ffn_hidden_size * per_matrix


def block_activation_terms(model: ModelSpec, index: int, seq: int, b: float, tp: int, precision: str,
                           cal: MemoryCalibration, etp: int | None = None, conv: str = "megatron",
                           dropout: bool | None = None) -> tuple[float, float, float]:
    """Bytes one block keeps for backward for ``b`` sequences without recomputation, as three parts:
    (outside the tp-split GEMMs, which sequence parallelism splits over tp; the rest: the tp-split part and
    MLA's latents, kept whole; the score term).

    fp32 (materialised scores): Sailor-checked ``act_replicated_sh`` s b h + the parallel part + the fp32
    score matrix. 16-bit (flash attention), per token: the norms' inputs and outputs (``act_norm_sh_*``),
    the dropout masks when dropout runs (``dropout``; default: models with biases, GPT-style), q, k, v and
    the attention output, the softmax statistics (fp32 per head), and the MLP: Megatron keeps the input of
    the activation function and of the second GEMM (``mats`` x ffn: swiglu 2f + f, gelu f + f); plain torch
    keeps one more f for a gated MLP (``silu(a) * b`` saves ``silu(a)``) and K and V repeated to every head
    (``repeat_kv``). (Flash attention returns its output laid out ``[b, s, heads, d]``, so the output
    projection's input is the same storage in both.)"""
    h = model.hidden_size
    tok = seq * b
    attn, attn_replicated = model.attention_activation_widths  # q, k, v, output (+ MLA latents, whole)
    if precision == "fp32":
        ffn = _ffn_split(model, index, tp, etp, model.mlp_matrices - 1)
        rep = tok * cal.act_replicated_sh * h * 4
        split = tok * ((attn + ffn) / tp + attn_replicated) * 4
        return rep, split, model.num_attention_heads / tp * seq * seq * b * 4
    ab = act_bytes(precision)
    mats = model.mlp_matrices
    if conv == "torch":
        norms = cal.act_norm_sh_megatron if model.bias else cal.act_norm_sh_torch_rms
        if model.attention == "mha":
            attn += 2 * (model.num_attention_heads - model.kv_heads) * model.head_dim  # repeat_kv
        ffn = _ffn_split(model, index, tp, etp, mats + 1 if mats == 3 else mats)
    else:
        norms = cal.act_norm_sh_megatron
        ffn = _ffn_split(model, index, tp, etp, mats)
    drop = model.bias if dropout is None else dropout
    rep = tok * (norms * h * ab + (cal.dropout_mask_bytes * h if drop else 0.0))
    split = tok * (((attn + ffn) * ab + 4 * model.num_attention_heads) / tp  # + fp32 log-sum-exp per head
                   + attn_replicated * ab)
    return rep, split, 0.0


def block_activation_bytes(model: ModelSpec, index: int, seq: int, b: float, tp: int, precision: str,
                           cal: MemoryCalibration, etp: int | None = None, convention: str = "megatron",
                           dropout: bool | None = None) -> float:
    """Activations one block keeps for backward, for ``b`` sequences, without recomputation or sequence
    parallelism (``etp``: each of an expert's etp ranks receives its tokens whole, so the dispatched copies
    scale by ``etp / tp``); the terms: :func:`block_activation_terms`."""
    return sum(block_activation_terms(model, index, seq, b, tp, precision, cal, etp, convention, dropout))


def torch_selective_bytes(model: ModelSpec, seq: int, b: float, tp: int, precision: str) -> float:
    """What torchtitan's op-level selective checkpointing keeps of a block (``recompute: selective`` under
    the ``torch`` convention): the block input, the attention output and its statistics, and the outputs of
    every second GEMM in execution order (q, v, w1, w2 of q, k, v, o, w1, w3, w2; torchtitan
    ``_apply_ac_to_transformer_block``: ``mm`` saved unless its count is even)."""
    h, a = model.hidden_size, model.num_attention_heads
    outs = [a * model.head_dim, model.kv_heads * model.head_dim, model.kv_heads * model.v_dim, h]
    outs += [model.ffn_hidden_size] * (model.mlp_matrices - 1) + [h]
    kept = sum(outs[0::2]) / tp + h + a * model.v_dim / tp
    return seq * b * (kept * act_bytes(precision) + 4 * a / tp)


def block_transient_bytes(model: ModelSpec, seq: int, b: float, tp: int, precision: str,
                          cal: MemoryCalibration) -> float:
    """Extra workspace while one block runs backward (score gradients without flash attention)."""
    if not uses_flash_attention(precision):
        return cal.score_transient_copies * model.num_attention_heads / tp * seq * seq * b * 4
    mats = model.mlp_matrices
    return 2 * seq * b * max(model.ffn_hidden_size, model.expert_ffn * model.experts_top_k) * mats / tp * act_bytes(precision)


def head_transient_bytes(model: ModelSpec, seq: int, b: float, tp: int, cal: MemoryCalibration,
                         precision: str = "fp32", convention: str = "megatron") -> float:
    """The logits and the loss's buffers on the last stage at their peak (bytes per logit element: fp32
    ``head_transient_copies`` x 4; 16-bit ``logit_bytes_megatron`` or ``logit_bytes_torch``)."""
    if precision == "fp32":
        per = cal.head_transient_copies * 4
    else:
        per = cal.logit_bytes_torch if convention == "torch" else cal.logit_bytes_megatron
    return per * seq * b * model.padded_vocab(tp) / tp


def state_bytes_per_param(precision: str, cal: MemoryCalibration) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter for Adam."""
    if precision == "fp32":
        return cal.fp32_weight, cal.fp32_grad, cal.fp32_optimizer
    return cal.mixed_weight, cal.mixed_grad, cal.mixed_optimizer
