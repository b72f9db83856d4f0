"""Version-2 stage features as the cost model prices them: recomputation mode and extent (full,
partial ``recompute_layers``, selective), the attention core that selective recomputation re-runs,
and the activation split of sequence parallelism. Sources and what is ignored: docs/cost-model.md,
"Version-2 features"."""

from __future__ import annotations

from arachne.cost.calibration import MemoryCalibration
from arachne.cost.compute import ComputeModel, act_bytes, uses_flash_attention
from arachne.cost.memory import block_activation_bytes
from arachne.spec.gpus import GPUType
from arachne.spec.model import ModelSpec


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
                       b: float, tp: int) -> float:
    """Forward seconds of one block's attention core (the two score GEMMs, plus the softmax/dropout passes
    over the score matrix without flash attention): what selective recomputation runs again in backward.
    Same terms as :meth:`ComputeModel.analytic_block`."""
    peak = gpu.peak_flops(precision)
    a = model.num_attention_heads
    gemm = compute._gemm(2 * b * a / tp * seq * seq * model.head_dim, peak)
    gemm += compute._gemm(2 * b * a / tp * seq * seq * model.v_dim, peak)
    elem = 0.0
    if not uses_flash_attention(precision):
        elem = compute.cal.score_passes * b * a / tp * seq * seq * 4
    return gemm + elem / gpu.hbm_bandwidth + compute.cal.kernel_launch_s


def score_bytes(model: ModelSpec, seq: int, b: float, tp: int, precision: str) -> float:
    """The score/softmax activations of one block (Korthikanti et al.'s 5as/h term; none with flash
    attention, which keeps no score matrix)."""
    if uses_flash_attention(precision):
        return 0.0
    return model.num_attention_heads / tp * seq * seq * b * 4


def block_acts_v2(model: ModelSpec, index: int, seq: int, b: float, tp: int, precision: str,
                  cal: MemoryCalibration, sp: bool, selective: bool) -> float:
    """:func:`block_activation_bytes` with sequence parallelism (the activations outside the tp-split
    GEMMs, ``act_replicated_sh * s b h``, split over tp) and selective recomputation (no score term)."""
    v = block_activation_bytes(model, index, seq, b, tp, precision, cal)
    if sp and tp > 1:
        v -= seq * b * cal.act_replicated_sh * model.hidden_size * act_bytes(precision) * (1 - 1 / tp)
    if selective:
        v -= score_bytes(model, seq, b, tp, precision)
    return v
