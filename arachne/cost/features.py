"""Version-2 stage features as the cost model prices them: recomputation mode and extent (full,
partial ``recompute_layers``, selective), the attention core that selective recomputation re-runs,
and the activation split of sequence parallelism. Sources and what is ignored: docs/cost-model.md,
"Version-2 features"."""

from __future__ import annotations

from arachne.cost.calibration import MemoryCalibration
from arachne.cost.compute import (
    ComputeModel,
    act_bytes,
    uses_flash_attention,
)
from arachne.cost.memory import block_activation_terms, torch_selective_bytes
from arachne.spec.gpus import GPUType
from arachne.spec.model import ModelSpec


def expert_tp(st) -> int | None:
    """The stage's expert tensor parallelism when it differs from tp or cp > 1 (priced as ``ep x etp x edp``), else
    None: ``etp`` equal to ``tp`` is version 1's spelling and priced exactly as version 1."""
    if st.cp > 1 or (st.etp is not None and st.etp != st.tp):
        return st.etp_size  # with cp > 1 Megatron's expert layout is ep x etp x edp over dp x cp x tp
    return None


def recompute_mode(st) -> str:
    """``"none"``, ``"full"`` or ``"selective"`` for a stage."""
    if st.recompute == "selective":
        return "selective"
    return "full" if st.recompute else "none"


def recomputed_blocks(st, n_blocks: int) -> int:
    """Blocks of a (single-range) stage of ``n_blocks`` that run full recomputation: all of them, or the
    first ``recompute_layers``; 0 without full recomputation."""
    if recompute_mode(st) != "full":
        return 0
    return n_blocks if st.recompute_layers is None else min(st.recompute_layers, n_blocks)


def chunk_recomputed_blocks(st) -> tuple[int, ...]:
    """Per chunk (range) of a stage, how many of its leading blocks are fully recomputed: the stage's first
    ``recompute_layers`` blocks in chunk order (Megatron's ``recompute_num_layers`` with the block method
    counts per model chunk; we count per stage, which is what the plan field says)."""
    left = recomputed_blocks(st, st.num_layers)
    out = []
    for a, z in st.ranges:
        k = min(left, z - a)
        out.append(k)
        left -= k
    return tuple(out)


def attention_core_fwd(compute: ComputeModel, model: ModelSpec, gpu: GPUType, precision: str, seq: int,
                       b: float, tp: int, kernel: str | None = None) -> float:
    """Forward seconds of one block's attention core (:meth:`ComputeModel.attention_core`) and one launch:
    what selective recomputation runs again in backward."""
    return compute.attention_core(model, gpu, precision, seq, b, tp, kernel)[0] + compute.cal.kernel_launch_s


def score_bytes(model: ModelSpec, seq: int, b: float, tp: int, precision: str) -> float:
    """The score/softmax activations of one block (Korthikanti et al.'s 5as/h term; none with flash
    attention, which keeps no score matrix)."""
    if uses_flash_attention(precision):
        return 0.0
    return model.num_attention_heads / tp * seq * seq * b * 4


def block_acts_v2(model: ModelSpec, index: int, seq: int, b: float, tp: int, precision: str,
                  cal: MemoryCalibration, sp: bool, selective: bool, etp: int | None = None,
                  convention: str = "megatron", modules: tuple[str, ...] | None = None) -> float:
    """:func:`block_activation_terms` with sequence parallelism (the activations outside the tp-split
    GEMMs split over tp, as Megatron keeps its sequence-parallel shards) and selective recomputation: the
    score term dropped (Megatron's core-attention recomputation; nothing to drop under flash attention), or,
    under the ``torch`` convention, what torchtitan's op-level selective checkpointing keeps
    (:func:`torch_selective_bytes`). With ``modules`` (a selective stage's ``recompute_modules``) the score term
    is dropped only for ``core_attn``, and each other module's bytes (:func:`recompute.dropped_bytes`)."""
    if selective and modules is not None:
        from arachne.cost.recompute import dropped_bytes

        rep, split, score = block_activation_terms(model, index, seq, b, tp, precision, cal, etp, convention)
        kept = rep / (tp if sp and tp > 1 else 1) + split + (0.0 if "core_attn" in modules else score)
        return kept - dropped_bytes(model, index, seq, b, tp, precision, sp, etp, modules)
    if selective and convention == "torch" and precision != "fp32":
        return torch_selective_bytes(model, seq, b, tp, precision)
    rep, split, score = block_activation_terms(model, index, seq, b, tp, precision, cal, etp, convention)
    return rep / (tp if sp and tp > 1 else 1) + split + (0.0 if selective else score)


TE_AMAX_HISTORY_LEN = 1024
"""Transformer Engine's ``DelayedScaling.amax_history_len`` default (transformer_engine/common/recipe/__init__.py,
TE 1.x-2.x); Megatron-LM's ``--fp8-amax-history-len`` defaults to 1, so this is the larger of the two."""
FP8_WEIGHT_COPY_BYTES = 2.0
"""Per GEMM weight under fp8: Transformer Engine's cached fp8 cast of the bf16 weight (1 byte) and its
transpose for the backward GEMMs (1 byte; Hopper's fp8 GEMMs take only the TN layout), kept across the
micro-batches of an iteration (``is_first_microbatch``; TE ``Float8Tensor`` with ``_transpose``)."""


def fp8_gemm_count(model: ModelSpec, index: int, ep: int) -> int:
    """TE Linear GEMMs in block ``index`` on one device: the attention projections, the MLP's matrices (per
    local expert and per shared-expert MLP in an MoE block)."""
    mats = model.mlp_matrices
    n = len(model.attention_gemms)
    if model.moe_layers[index]:
        return n + mats * (max(1, model.num_experts // ep) + (1 if model.num_shared_experts else 0))
    return n + mats


def fp8_extra_state_bytes(model: ModelSpec, gemm_params: float, a: int, z: int, ep: int) -> float:
    """Bytes fp8 training adds to the bf16 weights + fp32 master/optimizer state of one device holding
    ``gemm_params`` block parameters (blocks ``[a, z)``): the fp8 weight copy and transpose
    (:data:`FP8_WEIGHT_COPY_BYTES` per parameter; norms and biases, under 0.1% of a block, included) and
    the scaling state, per GEMM three tensors (input, weight, output gradient) of an fp32 amax history of
    :data:`TE_AMAX_HISTORY_LEN` plus scale and inverse scale."""
    meta = sum(fp8_gemm_count(model, i, ep) for i in range(a, z)) * 3 * (TE_AMAX_HISTORY_LEN + 2) * 4
    return gemm_params * FP8_WEIGHT_COPY_BYTES + meta


def fp8_act_saving(model: ModelSpec, seq: int, b: float, tp: int, sp: bool) -> float:
    """Bytes one block's saved activations shrink by under fp8: Transformer Engine's LayerNormLinear saves
    its normalised output (the GEMM input, ``h`` per token, replicated over tp unless sequence parallel)
    in fp8 (1 byte) rather than bf16 (2) for the two of them (QKV and fc1). Everything else keeps its
    bf16 size: the attention core's q/k/v/output (fp8 attention is off by default), residuals, and the
    fc2 input, which this model's per-block count does not separate (so fp8 memory errs high)."""
    return 2 * seq * b * model.hidden_size * 1 / (tp if sp and tp > 1 else 1)


def cp_kv_width(model: ModelSpec) -> int:
    """Per-token elements of the keys and values a context-parallel ring passes on (all heads): grouped-query
    K and V, or MLA's full per-head K (``head_dim``) and V (``v_dim``), as Megatron's CP sends them."""
    if model.attention == "mha":
        return 2 * model.kv_heads * model.head_dim
    return model.num_attention_heads * (model.head_dim + model.v_dim)


def cp_ring_step(network, model: ModelSpec, precision: str, seq: int, b: float, tp: int, cp: int, groups, gi: int,
                 rings: dict[int, float] | None = None) -> float:
    """Seconds of one step of the context-parallel ring of TP group ``gi`` (each rank passes its K/V chunk to
    the next; the slowest hop); ``rings``: as for :func:`cp_ring_exposed`."""
    d = gi // cp
    comm = rings.get(d) if rings is not None else None
    if comm is None:
        members = [list(groups[d * cp + j]) for j in range(cp)]
        nbytes = b * seq * cp_kv_width(model) / tp * act_bytes(precision)
        comm = max(network.p2p_time(members[j], members[(j + 1) % cp], nbytes * len(members[j])) for j in range(cp))
        if rings is not None:
            rings[d] = comm
    return comm


def cp_ring_exposed(network, compute: ComputeModel, model: ModelSpec, gpu: GPUType, precision: str, seq: int,
                    b: float, tp: int, cp: int, groups, gi: int, kernel: str | None = None,
                    rings: dict[int, float] | None = None) -> tuple[float, float]:
    """Exposed seconds of one block's context-parallel ring exchange (forward, backward) for TP group ``gi``
    of a stage (``b``: sequences per rank already divided by cp). Forward: ``cp - 1`` steps, each passing the
    local K/V chunk to the next rank while the step's attention (1/cp of the rank's core) runs; backward:
    ``cp - 1`` steps carrying K/V and dK/dV (twice the bytes) behind the step's backward core. Per step the
    exposed time is ``max(0, comm - compute)`` (ring attention, Liu et al., arXiv 2310.01889; Megatron-Core
    ``AttnFuncWithCPAndKVP2P``). The ring's slowest hop prices a step. ``rings``: each ring's step time by its
    index, filled here (the ``cp`` TP groups of one ring share it; the caller keys it by everything else)."""
    comm = cp_ring_step(network, model, precision, seq, b, tp, cp, groups, gi, rings)
    fwd, bwd = compute.attention_core(model, gpu, precision, seq, b, tp, kernel)
    return (cp - 1) * max(0.0, comm - fwd / cp), (cp - 1) * max(0.0, 2 * comm - bwd / cp)
