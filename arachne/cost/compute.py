"""Per-layer compute time: measured profiles when they exist, else an analytic roofline model.

The analytic model prices every GEMM of a block at ``peak * e * w / (w + w_half)`` (e: the measured
maximum-achievable matmul efficiency of the GPU's generation; small GEMMs reach less of it), adds HBM
traffic of the element-wise work (norms, activations, softmax over the score matrix when flash attention
is not used; an MoE layer's traffic by implementation, :mod:`arachne.cost.moe_layer`) and kernel launches.
Backward is twice the forward GEMM work. Constants: :mod:`arachne.cost.calibration`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arachne.cost.calibration import MATMUL_EFFICIENCY, ComputeCalibration
from arachne.cost.moe_layer import expert_gemms, moe_extra_bytes
from arachne.profiles.format import ProfileDB
from arachne.spec.gpus import GPUType
from arachne.spec.model import ModelSpec


def act_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def core_precision(precision: str) -> str:
    """The precision of the work FP8 training leaves in bf16 (attention core, router, output layer, element-wise
    ops): Transformer Engine runs only its Linear GEMMs in fp8 (docs/cost-model.md, "FP8")."""
    return "bf16" if precision == "fp8" else precision


def uses_flash_attention(precision: str) -> bool:
    """FlashAttention kernels exist for fp16/bf16 only; fp32 training materialises scores."""
    return precision != "fp32"


ATTENTION_EFFICIENCY: dict[tuple[str, str], tuple[float, float]] = {
    ("hopper", "cudnn"): (529 / 989, 541 / 989),
    ("hopper", "flash2"): (333 / 989, 299 / 989),
    ("blackwell", "cudnn"): (1574 / 2500, 1332 / 2500),
}
"""Causal attention kernels, bf16, head dim 128, 8K tokens: (forward, backward) TFLOPS over the GPU's dense bf16
peak, FLOPs counted as the kernels' authors count them (causal: half the score matrix; backward 2.5x the
forward). Hopper cudnn: forward 529 on H100 (FlashAttention-3 figure, Dao-AILab/flash-attention
``assets/flash3_fp16_fwd.png``), backward 541 on H200 (same dense peak; NVIDIA/cudnn-frontend's committed
SDPA benchmark, Llama-3.1 shapes, cuDNN 9.19.1). Hopper flash2: forward 333 (the same FA3 figure), backward
299 from the forward + backward figure's 308 (``assets/flash2_h100_fwd_bwd_benchmark.png``). Blackwell cudnn:
GB200's 1574 / 1332 (cudnn-frontend). A generation or kernel not listed: the two score GEMMs over the whole
score matrix at the GEMM rate (docs/cost-model.md, "Attention")."""

ATTENTION_SEQ_HALF = 400.0
"""Sequence length at which a fused attention kernel reaches half its long-sequence rate (FlashAttention-2
causal forward on H100: 191 / 298 / 333 / 335 TFLOPS at 512 / 2K / 8K / 16K tokens follow
``s / (s + 400)`` within 3%)."""


EAGER_NORM_BYTES = (67.7, 148.1)
"""Eager PyTorch RMSNorm over a fused (``torch.compile``d) one, 16-bit activations: (forward, backward) extra HBM
bytes per element of the norm's input, at the GPU's nominal bandwidth. Measured: LinkedIn Liger-Kernel's H100 NVL
benchmark (``benchmark/data/h100_all_benchmark_data.csv`` @ 3534d446, 2025-01): the Hugging Face Llama RMSNorm
(upcast to fp32, pow, mean, rsqrt, two multiplies, downcast: one kernel each) against ``torch.compile`` of it,
2048 rows of 8192, times the card's 3.9 TB/s (``data/components/elementwise.yaml``)."""

EAGER_ROPE_BYTES = (49.2, 44.2)
"""The same for rotary embedding, per element of the queries and keys it rotates (Hugging Face ``rotate_half``
RoPE eager against compiled, 8192 tokens, 32 query and 8 key heads of width 256; same source)."""


EAGER_MODES = ("split", "replicated")
"""How a block's eager element-wise ops are laid out over tp (the ``eager`` argument below; None: fused kernels):
``split``: each rank's norms see ``1/tp`` of the tokens (sequence parallelism, or tp 1); ``replicated``: every
rank normalises the whole sequence."""


def eager_extra_bytes(model: ModelSpec, tokens: float, tp: int, mode: str = "split") -> tuple[float, float]:
    """(forward, backward) HBM bytes one block's eager element-wise ops move beyond fused kernels: the two
    RMSNorms (a model with biases has LayerNorm, whose eager ``nn.LayerNorm`` is one native kernel already:
    nothing) over ``1/tp`` of the tokens in ``split`` mode, all of them ``replicated``; rotary embedding on the
    queries and keys of the rank's heads (MLA: its rotary part). Ignored: q/k norms, the activation function and
    residual adds (eager SwiGLU costs within 2% of compiled in the same source)."""
    a = model.num_attention_heads
    norm = 0.0 if model.bias else 2 * tokens * model.hidden_size / (tp if mode == "split" else 1)
    if model.position_embedding != "rope":
        qk = 0.0
    elif model.attention == "mla":
        qk = tokens * (a / tp + 1) * (model.qk_rope_head_dim or 0)
    else:
        qk = tokens * (a + model.kv_heads) * model.head_dim / tp
    return (EAGER_NORM_BYTES[0] * norm + EAGER_ROPE_BYTES[0] * qk,
            EAGER_NORM_BYTES[1] * norm + EAGER_ROPE_BYTES[1] * qk)


def default_attention_kernel(gpu: GPUType) -> str:
    """The kernel a plan that names none runs: ``cudnn`` on Hopper and Blackwell (Transformer Engine's default,
    and PyTorch SDPA's from torch 2.10 with cuDNN 9.15.1), ``flash2`` elsewhere."""
    return "cudnn" if gpu.generation in ("hopper", "blackwell") else "flash2"


@dataclass(frozen=True)
class LayerCosts:
    """Seconds per micro-batch on one GPU of a TP group: per block, embedding, head.

    ``fwd_cum``/``bwd_cum`` are prefix sums so a stage's time over blocks [a, b) is O(1).
    ``includes_tp_comm`` says whether TP collectives are inside the times (measured profiles).
    """

    fwd_cum: np.ndarray
    bwd_cum: np.ndarray
    emb_fwd: float
    emb_bwd: float
    head_fwd: float
    head_bwd: float
    source: str
    includes_tp_comm: bool
    optimizer_s_profiled: float | None = None

    def blocks(self, a: int, b: int) -> tuple[float, float]:
        return float(self.fwd_cum[b] - self.fwd_cum[a]), float(self.bwd_cum[b] - self.bwd_cum[a])


class ComputeModel:
    """Prices layers for (model, GPU, precision, sequence, micro-batch, tp, ep, recompute)."""

    def __init__(self, profiles: ProfileDB | None, cal: ComputeCalibration):
        self.profiles = profiles
        self.cal = cal
        self._cache: dict[tuple, LayerCosts] = {}

    # ---- analytic -----------------------------------------------------------------------------
    def _gemm(self, flops: float, peak: float) -> float:
        """Seconds of one GEMM of ``flops`` at ``peak`` (already the achievable rate, see :meth:`gemm_peak`)."""
        if flops <= 0:
            return 0.0
        return flops / (peak * flops / (flops + self.cal.w_half))

    def gemm_peak(self, gpu: GPUType, precision: str) -> float:
        """Achievable large-GEMM FLOP/s: the dense peak times the measured efficiency of the GPU's generation
        at that precision (``MATMUL_EFFICIENCY``), else times the fitted ``e_max``."""
        key = "bf16" if precision == "fp16" else precision
        eff = MATMUL_EFFICIENCY.get((gpu.generation, key), self.cal.e_max)
        return gpu.peak_flops(precision) * eff

    def attention_core(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                       kernel: str | None = None) -> tuple[float, float]:
        """Forward and backward seconds of one block's attention core (``b`` sequences, ``a/tp`` heads).

        16-bit with a measured kernel (``kernel``, default :func:`default_attention_kernel`;
        ``ATTENTION_EFFICIENCY``): half the score matrix's FLOPs (causal), forward and 2.5x that backward, each
        at its measured share of the dense bf16 peak, scaled by ``s / (s + ATTENTION_SEQ_HALF)`` relative to
        8K tokens. Otherwise the two score GEMMs over the whole matrix at the GEMM rate (backward
        ``bwd_over_fwd`` times), plus, without flash attention (fp32), ``score_passes`` fp32 passes over it."""
        c = self.cal
        a = model.num_attention_heads
        core = self.gemm_peak(gpu, core_precision(precision))  # the attention core stays bf16 under fp8
        if uses_flash_attention(precision):
            eff = ATTENTION_EFFICIENCY.get((gpu.generation, kernel or default_attention_kernel(gpu)))
            if eff is not None:
                flops = b * a / tp * seq * seq * (model.head_dim + model.v_dim)  # half of the two full GEMMs
                half = ATTENTION_SEQ_HALF
                rate = gpu.peak_flops("bf16") * (seq / (seq + half)) / (8192 / (8192 + half))
                return flops / (eff[0] * rate), 2.5 * flops / (eff[1] * rate)
        gemm = self._gemm(2 * b * a / tp * seq * seq * model.head_dim, core)
        gemm += self._gemm(2 * b * a / tp * seq * seq * model.v_dim, core)
        elem = 0.0
        if not uses_flash_attention(precision):
            elem = c.score_passes * b * a / tp * seq * seq * 4 / gpu.hbm_bandwidth
        return gemm + elem, c.bwd_over_fwd * gemm + 2 * elem

    def analytic_block(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                       ep: int, moe: bool, etp: int | None = None, kernel: str | None = None,
                       eager: str | None = None, moe_kernels: str | None = None) -> tuple[float, float]:
        """Forward and backward seconds of one block (TP communication excluded); ``etp``: the routed experts'
        own tensor parallelism (None: ``tp``), the stage's devices re-partitioned as ``ep x etp x edp``;
        ``kernel``: the attention kernel (:meth:`attention_core`); ``eager`` (:data:`EAGER_MODES`): 16-bit
        element-wise ops run as eager PyTorch kernels (:func:`eager_extra_bytes` on top; fp32's fitted count is
        already unfused); ``moe_kernels``: the MoE layer's implementation (:data:`~.moe_layer.MOE_KERNELS`)."""
        c = self.cal
        peak = self.gemm_peak(gpu, precision)  # the Linear GEMMs (fp8 rate under fp8)
        core = self.gemm_peak(gpu, core_precision(precision))  # the router stays bf16 under fp8
        h = model.hidden_size
        tokens = b * seq
        ab = act_bytes(precision)
        mats = model.mlp_matrices
        gemm = 0.0
        for i, o, split in model.attention_gemms:  # projections; MLA's down projections are not split by tp
            gemm += self._gemm(2 * tokens * i * o / (tp if split else 1), peak)
        att_f, att_b = self.attention_core(model, gpu, precision, seq, b, tp, kernel)
        elem = c.elementwise_passes * tokens * h * ab * (c.replicated_fraction + (1 - c.replicated_fraction) / tp)
        moe_f = moe_b = 0.0
        if moe:
            gemm += expert_gemms(lambda f: self._gemm(f, peak), model, tokens, tp, ep, etp)
            gemm += self._gemm(2 * tokens * h * model.num_experts, core)  # router
            if model.num_shared_experts:
                width = model.shared_expert_ffn_hidden_size or model.expert_ffn * model.num_shared_experts
                gemm += mats * self._gemm(2 * tokens * h * width / tp, peak)
            moe_f, moe_b = moe_extra_bytes(model, tokens, tp, ep, etp, ab, moe_kernels)
        else:
            gemm += mats * self._gemm(2 * tokens * h * model.ffn_hidden_size / tp, peak)
            elem += 2 * tokens * model.ffn_hidden_size / tp * ab * mats
        launch = c.kernel_launch_s * c.kernels_per_block_fwd
        fwd = gemm + att_f + (elem + moe_f) / gpu.hbm_bandwidth + launch
        bwd = c.bwd_over_fwd * gemm + att_b + (2 * elem + moe_b) / gpu.hbm_bandwidth + 2 * launch
        if eager is not None and precision != "fp32":
            xf, xb = eager_extra_bytes(model, tokens, tp, eager)
            fwd, bwd = fwd + xf / gpu.hbm_bandwidth, bwd + xb / gpu.hbm_bandwidth
        return fwd, bwd

    def analytic_ends(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float,
                      tp: int) -> tuple[float, float, float, float]:
        """(embedding fwd, bwd, head fwd, bwd): lookup, final norm, output GEMM and the loss."""
        tokens = b * seq
        ab = act_bytes(precision)
        h, V = model.hidden_size, model.padded_vocab(tp)
        hbm = gpu.hbm_bandwidth
        emb_f = 3 * tokens * h * ab / hbm + 2 * self.cal.kernel_launch_s
        emb_b = 2 * emb_f
        logits = 2 * tokens * h * V / tp
        peak = self.gemm_peak(gpu, core_precision(precision))  # the output layer is not a TE Linear: bf16 under fp8
        loss_elem = 6 * tokens * V / tp * 4
        head_f = self._gemm(logits, peak) + (loss_elem + 2 * tokens * h * ab) / hbm + 4 * self.cal.kernel_launch_s
        head_b = 2 * self._gemm(logits, peak) + loss_elem / hbm + 4 * self.cal.kernel_launch_s
        return emb_f, emb_b, head_f, head_b

    def _analytic(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                  ep: int, etp: int | None = None, kernel: str | None = None,
                  eager: str | None = None, moe_kernels: str | None = None) -> LayerCosts:
        L = model.num_layers
        fwd = np.zeros(L + 1)
        bwd = np.zeros(L + 1)
        dense = moe = None
        for i in range(L):
            if model.moe_layers[i]:
                moe = moe or self.analytic_block(model, gpu, precision, seq, b, tp, ep, True, etp, kernel, eager,
                                                 moe_kernels)
                f, bw = moe
            else:
                dense = dense or self.analytic_block(model, gpu, precision, seq, b, tp, ep, False, kernel=kernel,
                                                     eager=eager)
                f, bw = dense
            fwd[i + 1] = fwd[i] + f
            bwd[i + 1] = bwd[i] + bw
        ef, eb, hf, hb = self.analytic_ends(model, gpu, precision, seq, b, tp)
        return LayerCosts(fwd, bwd, ef, eb, hf, hb, "analytic", False)

    # ---- measured -----------------------------------------------------------------------------
    def _profiled(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                  tp_comm) -> LayerCosts | None:
        if self.profiles is None:
            return None
        pset = self.profiles.get(model.name, gpu.name, precision)
        if pset is None or pset.doc.sequence_length != seq:
            return None
        tps = pset.tps
        if not tps:
            return None
        base_tp = tp if pset.has_tp(tp) else min(tps, key=lambda t: (abs(np.log2(t / tp)), t))
        emb, blocks, head, opt = pset.parts(base_tp, b)
        if len(blocks) != model.num_layers:
            return None
        scale_f = scale_b = 1.0
        source = "profile"
        if base_tp != tp:
            # scale the measurement by the analytic ratio (compute + TP traffic) between the two degrees
            f1, b1 = self.analytic_block(model, gpu, precision, seq, b, tp, 1, False)
            f0, b0 = self.analytic_block(model, gpu, precision, seq, b, base_tp, 1, False)
            c1, c0 = tp_comm(tp), tp_comm(base_tp)
            scale_f, scale_b = (f1 + c1) / (f0 + c0), (b1 + c1) / (b0 + c0)
            source = f"profile(tp={base_tp}, scaled)"
        fwd = np.concatenate([[0.0], np.cumsum([x.fwd * scale_f for x in blocks])])
        bwd = np.concatenate([[0.0], np.cumsum([x.bwd * scale_b for x in blocks])])
        return LayerCosts(fwd, bwd, emb.fwd * scale_f, emb.bwd * scale_b, head.fwd * scale_f, head.bwd * scale_b,
                          source, True, opt)

    def layer_costs(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                    ep: int = 1, tp_comm=None, etp: int | None = None, kernel: str | None = None,
                    eager: str | None = None, moe_kernels: str | None = None) -> LayerCosts:
        """Per-layer costs; ``tp_comm(tp)`` gives one block's fwd TP traffic time for scaling profiles;
        ``kernel``, ``eager``: the attention kernel and eager element-wise ops of analytic blocks (profiles
        measured their own); ``moe_kernels``: the MoE layer's implementation."""
        key = (model.key, gpu.name, precision, seq, b, tp, ep, etp, kernel, eager, moe_kernels)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        costs = None
        if not model.is_moe:
            costs = self._profiled(model, gpu, precision, seq, b, tp, tp_comm or (lambda t: 0.0))
        if costs is None:
            costs = self._analytic(model, gpu, precision, seq, b, tp, ep, etp, kernel, eager, moe_kernels)
        self._cache[key] = costs
        return costs
