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
    cached: float = 0.0
    """Transient bytes of the stage's other phase (:func:`peak_transient`): never allocated at the same time as
    ``transient``, so not in :attr:`total`, but the caching allocator may keep them reserved."""

    @property
    def total(self) -> float:
        """The allocated peak: what must fit in the GPU's memory."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient + self.overhead

    @property
    def reserved(self) -> float:
        """An upper bound of the caching allocator's reserved peak (what ``torch.cuda.max_memory_reserved``
        reports, e.g. torchtitan's logged memory): :attr:`total` plus the other phase's transients, whose freed
        segments the allocator keeps cached while the GPU has room (it releases them and retries before it
        reports out-of-memory, so they never decide whether a plan fits)."""
        return self.total + self.cached


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
torchtitan and llm-foundry run them) for ``zero_stage`` 3 (docs/cost-model.md, "Memory per device"). Under fp8,
``megatron`` is Transformer Engine, which caches an fp8 copy and transpose of every weight across the micro-batches
(``features.fp8_extra_state_bytes``); ``torch`` is torchao's float8 (torchtitan), which casts at each use and
caches nothing (``Float8Linear``), so its persistent weights are bf16's."""


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
                         precision: str = "fp32", convention: str = "megatron", loss: str | None = None) -> float:
    """The logits and the loss's buffers on the last stage at their peak (bytes per logit element: fp32
    ``head_transient_copies`` x 4; 16-bit ``logit_bytes_megatron`` or ``logit_bytes_torch``). ``loss: fused`` (a
    fused or compiled cross-entropy: flash-attn's ``CrossEntropyLoss``, a ``torch.compile``d loss, Transformer
    Engine's): the logits in the activation type, which the kernel keeps for backward with one fp32 log-sum-exp per
    token, and their gradient in the same type, ``2 x act_bytes`` per element; no fp32 copy is materialised."""
    if loss == "fused":
        return (2 * act_bytes(precision) * model.padded_vocab(tp) / tp + 4) * seq * b
    if precision == "fp32":
        per = cal.head_transient_copies * 4
    else:
        per = cal.logit_bytes_torch if convention == "torch" else cal.logit_bytes_megatron
    return per * seq * b * model.padded_vocab(tp) / tp


def peak_transient(block_phase: float, head_phase: float) -> float:
    """The transient bytes of a stage at its peak, from its two phases, which never overlap in time.

    ``block_phase``: while one block runs backward (its recomputed activations, the backward workspace, the
    parameters and unsharded gradients gathered for it, a gradient bucket being reduced). ``head_phase`` (last
    stage only, else 0): while the loss runs, before any block's backward starts (the logits and the loss's
    buffers, and under FSDP the gathered output layer). The logits' gradient is consumed by the output layer's
    backward and freed before the last block's backward begins; a recomputed block is rebuilt only when its
    backward is due. So the two add to the activations kept for backward separately: the peak is the larger."""
    return max(block_phase, head_phase)


def state_bytes_per_param(precision: str, cal: MemoryCalibration) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter for Adam."""
    if precision == "fp32":
        return cal.fp32_weight, cal.fp32_grad, cal.fp32_optimizer
    return cal.mixed_weight, cal.mixed_grad, cal.mixed_optimizer


MASTER_WEIGHT_BYTES = 4.0
"""The fp32 master copy of a parameter: part of ``mixed_optimizer`` (Megatron's distributed optimizer: master 4 +
Adam's m, v 8) and the whole of ``fsdp_weight`` (FSDP's fp32 sharded parameter)."""
ADAM_MOMENTS = 2
"""Adam's state tensors per parameter (m and v), fp32 (4 bytes each) unless ``optimizer_state_dtype`` says bf16."""


def optimizer_options(precision: str, cal: MemoryCalibration, master_weights: str | None,
                      state_dtype: str | None) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """(weights, gradients, optimizer) bytes per parameter for Adam, as :func:`state_bytes_per_param` gives them
    (zero_stage 0-2) and under FSDP (``fsdp_*``, zero_stage 3), with a plan's optimizer settings.
    ``master_weights: none``: no fp32 master copy (the optimizer steps the 16-bit parameters: FSDP's shard is 16-bit,
    and so are the parameters' gradients); ``optimizer_state_dtype: bf16``: m and v in 2 bytes each. fp32 training
    is left as it is (its parameters are the master copy). Both unset: the calibration's values, unchanged."""
    mixed = state_bytes_per_param(precision, cal)
    fsdp = (cal.fsdp_weight, cal.fsdp_grad, cal.fsdp_optimizer)
    if precision == "fp32" or (master_weights in (None, "fp32") and state_dtype in (None, "fp32")):
        return mixed, fsdp
    (w, g, o), (fw, fg, fo) = mixed, fsdp
    ab = act_bytes(precision)
    if master_weights == "none":
        o, g, fw, fg = o - MASTER_WEIGHT_BYTES, ab, ab, ab
    if state_dtype == "bf16":
        o, fo = o - ADAM_MOMENTS * 2.0, fo - ADAM_MOMENTS * 2.0
    return (w, g, o), (fw, fg, fo)
