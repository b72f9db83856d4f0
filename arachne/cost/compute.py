"""Per-layer compute time: measured profiles when they exist, else an analytic roofline model.

The analytic model prices every GEMM of a block at ``peak * e * w / (w + w_half)`` (e: the measured
maximum-achievable matmul efficiency of the GPU's generation; small GEMMs reach less of it), adds HBM
traffic of the element-wise work (norms, activations, softmax over the score matrix when flash attention
is not used) and kernel launches. Backward
is twice the forward GEMM work. Constants: :mod:`arachne.cost.calibration`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arachne.cost.calibration import MATMUL_EFFICIENCY, ComputeCalibration
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

    def analytic_block(self, model: ModelSpec, gpu: GPUType, precision: str, seq: int, b: float, tp: int,
                       ep: int, moe: bool, etp: int | None = None) -> tuple[float, float]:
        """Forward and backward seconds of one block (TP communication excluded); ``etp``: the routed experts'
        own tensor parallelism (None: ``tp``), the stage's devices re-partitioned as ``ep x etp x edp``."""
        c = self.cal
        peak = self.gemm_peak(gpu, precision)  # the Linear GEMMs (fp8 rate under fp8)
        core = self.gemm_peak(gpu, core_precision(precision))  # attention core and router stay bf16 under fp8
        h, a = model.hidden_size, model.num_attention_heads
        tokens = b * seq
        ab = act_bytes(precision)
        mats = model.mlp_matrices
        gemm = 0.0
        for i, o, split in model.attention_gemms:  # projections; MLA's down projections are not split by tp
            gemm += self._gemm(2 * tokens * i * o / (tp if split else 1), peak)
        # scores: two batched GEMMs of (a/tp) heads, s x s x head_dim (q.k) and s x s x v_dim (scores.v)
        if model.v_dim == model.head_dim:
            gemm += 2 * self._gemm(2 * b * a / tp * seq * seq * model.head_dim, core)
        else:
            gemm += self._gemm(2 * b * a / tp * seq * seq * model.head_dim, core)
            gemm += self._gemm(2 * b * a / tp * seq * seq * model.v_dim, core)
        elem = c.elementwise_passes * tokens * h * ab * (c.replicated_fraction + (1 - c.replicated_fraction) / tp)
        if moe:
            k, E = model.experts_top_k, model.num_experts
            if etp is None:
                tok_e = tokens * k * ep / E
                gemm += (E / ep) * mats * self._gemm(2 * tok_e * h * model.expert_ffn / tp, peak)
            else:  # one expert's tokens over its edp = n/(ep etp) replicas; the stage's n devices hold n/tp x tokens
                tok_e = tokens * k * ep * etp / (E * tp)
                gemm += (E / ep) * mats * self._gemm(2 * tok_e * h * model.expert_ffn / etp, peak)
            gemm += self._gemm(2 * tokens * h * E, core)  # router
            if model.num_shared_experts:
                width = model.shared_expert_ffn_hidden_size or model.expert_ffn * model.num_shared_experts
                gemm += mats * self._gemm(2 * tokens * h * width / tp, peak)
            elem += 4 * tokens * k * h * ab + 2 * tokens * k * model.expert_ffn / tp * ab * mats
        else:
            gemm += mats * self._gemm(2 * tokens * h * model.ffn_hidden_size / tp, peak)
            elem += 2 * tokens * model.ffn_hidden_size / tp * ab * mats
        if not uses_flash_attention(precision):
            elem += c.score_passes * b * a / tp * seq * seq * 4
        launch = c.kernel_launch_s * c.kernels_per_block_fwd
        fwd = gemm + elem / gpu.hbm_bandwidth + launch
        bwd = c.bwd_over_fwd * gemm + 2 * elem / gpu.hbm_bandwidth + 2 * launch
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
                  ep: int, etp: int | None = None) -> LayerCosts:
        L = model.num_layers
        fwd = np.zeros(L + 1)
        bwd = np.zeros(L + 1)
        dense = moe = None
        for i in range(L):
            if model.moe_layers[i]:
                moe = moe or self.analytic_block(model, gpu, precision, seq, b, tp, ep, True, etp)
                f, bw = moe
            else:
                dense = dense or self.analytic_block(model, gpu, precision, seq, b, tp, ep, False)
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
                    ep: int = 1, tp_comm=None, etp: int | None = None) -> LayerCosts:
        """Per-layer costs; ``tp_comm(tp)`` gives one block's fwd TP traffic time for scaling profiles."""
        key = (model.key, gpu.name, precision, seq, b, tp, ep, etp)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        costs = None
        if not model.is_moe:
            costs = self._profiled(model, gpu, precision, seq, b, tp, tp_comm or (lambda t: 0.0))
        if costs is None:
            costs = self._analytic(model, gpu, precision, seq, b, tp, ep, etp)
        self._cache[key] = costs
        return costs
