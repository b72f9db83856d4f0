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


def block_activation_bytes(model: ModelSpec, index: int, seq: int, b: float, tp: int, precision: str,
                           cal: MemoryCalibration, etp: int | None = None) -> float:
    """Activations one block keeps for backward, for ``b`` sequences, without recomputation (``etp``: each of
    an expert's etp ranks receives its tokens whole, so the dispatched copies scale by ``etp / tp``)."""
    h = model.hidden_size
    mats = model.mlp_matrices
    if model.moe_layers[index]:
        k = model.experts_top_k
        ffn = k * model.expert_ffn * (mats - 1) + 2 * k * h * (1 if etp is None else etp / tp)
        if model.num_shared_experts:
            ffn += (model.shared_expert_ffn_hidden_size or model.expert_ffn * model.num_shared_experts) * (mats - 1)
    else:
        ffn = model.ffn_hidden_size * (mats - 1)
    attn, attn_replicated = model.attention_activation_widths  # q, k, v, output (+ MLA latents, whole)
    parallel = attn + ffn
    elems = seq * b * (cal.act_replicated_sh * h + attn_replicated + parallel / tp)
    total = elems * act_bytes(precision)
    if not uses_flash_attention(precision):
        total += model.num_attention_heads / tp * seq * seq * b * 4
    return total


def block_transient_bytes(model: ModelSpec, seq: int, b: float, tp: int, precision: str,
                          cal: MemoryCalibration) -> float:
    """Extra workspace while one block runs backward (score gradients without flash attention)."""
    if not uses_flash_attention(precision):
        return cal.score_transient_copies * model.num_attention_heads / tp * seq * seq * b * 4
    mats = model.mlp_matrices
    return 2 * seq * b * max(model.ffn_hidden_size, model.expert_ffn * model.experts_top_k) * mats / tp * act_bytes(precision)


def head_transient_bytes(model: ModelSpec, seq: int, b: float, tp: int, cal: MemoryCalibration) -> float:
    """Logits and their fp32 softmax/gradient buffers on the last stage."""
    return cal.head_transient_copies * seq * b * model.padded_vocab(tp) / tp * 4


def state_bytes_per_param(precision: str, cal: MemoryCalibration) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter for Adam."""
    if precision == "fp32":
        return cal.fp32_weight, cal.fp32_grad, cal.fp32_optimizer
    return cal.mixed_weight, cal.mixed_grad, cal.mixed_optimizer
