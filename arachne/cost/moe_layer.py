"""The routed-expert (MoE) layer's compute: its GEMMs and the memory traffic around them.

One home for what an MoE block costs beyond attention, for :meth:`ComputeModel.analytic_block`, the recomputation
of the ``moe`` module (recompute.py) and the component benchmark (``python -m benchmarks cost-model moe-layer``).

The experts' GEMMs are priced like every GEMM (:meth:`ComputeModel._gemm`). What an implementation adds around
them (routing, token permutation and its inverse, the activation, the weighted aggregation, per-expert weight
traffic and the GEMMs' epilogues) is priced as HBM traffic in two measured parts: passes over the expert GEMMs'
output elements (``T k (n (m - 1) + d)`` per layer for ``T`` tokens, top-``k`` routing, expert width ``n``,
``m`` MLP matrices, hidden ``d``) and passes over the experts' weights held on the GPU (``E/ep m d n``), each at
the activation type's width. The pass counts (:data:`MOE_LAYER_PASSES`) are fitted on whole-layer measurements
(``data/components/moe_layer.yaml``) per implementation class (:data:`MOE_KERNELS`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from arachne.cost.calibration import MOE_LAYER_PASSES

if TYPE_CHECKING:
    from arachne.spec.model import ModelSpec

MOE_KERNELS = ("grouped", "fused")
"""The MoE layer implementations priced apart (a plan's ``moe_kernels``; None reads ``grouped``):
``grouped``: token permutation, grouped expert GEMMs and separate activation and aggregation kernels
(Megatron-Core's MoE layer); ``fused``: IO-aware kernels that gather tokens inside the GEMM and fuse the
activation and aggregation into its epilogue (SonicMoE)."""


def expert_shape(model: ModelSpec, tokens: float, tp: int, ep: int, etp: int | None) -> tuple[float, float, float]:
    """``(tokens per local expert, local experts, expert width per GPU)`` of one MoE block on one GPU holding
    ``tokens`` tokens: ``etp`` None splits the experts' width by ``tp``; else the stage's devices are
    re-partitioned as ``ep x etp x edp`` and one expert's tokens spread over its ``edp`` replicas."""
    k, E = model.experts_top_k, model.num_experts
    if etp is None:
        return tokens * k * ep / E, E / ep, model.expert_ffn / tp
    return tokens * k * ep * etp / (E * tp), E / ep, model.expert_ffn / etp


def expert_gemms(gemm: Callable[[float], float], model: ModelSpec, tokens: float, tp: int, ep: int,
                 etp: int | None) -> float:
    """Forward seconds of the routed experts' GEMMs of one block (``gemm(flops)``: one GEMM at the Linear rate)."""
    tok_e, local, width = expert_shape(model, tokens, tp, ep, etp)
    return local * model.mlp_matrices * gemm(2 * tok_e * model.hidden_size * width)


def traffic_elements(model: ModelSpec, tokens: float, tp: int, ep: int, etp: int | None) -> tuple[float, float]:
    """(expert GEMM output elements, local expert weight elements) of one MoE block on one GPU: what one pass of
    each part of :data:`MOE_LAYER_PASSES` reads or writes."""
    tok_e, local, width = expert_shape(model, tokens, tp, ep, etp)
    mats, h = model.mlp_matrices, model.hidden_size
    return tok_e * local * ((mats - 1) * width + h), local * mats * h * width


def moe_extra_bytes(model: ModelSpec, tokens: float, tp: int, ep: int, etp: int | None, act_bytes: int,
                    kernels: str | None = None) -> tuple[float, float]:
    """(forward, backward) HBM bytes one MoE block moves beyond its GEMMs with the ``kernels`` implementation
    (:data:`MOE_KERNELS`; None: ``grouped``): :data:`MOE_LAYER_PASSES` over the expert GEMMs' output elements and
    over the local experts' weights (:func:`traffic_elements`)."""
    out_f, w_f, out_b, w_b = MOE_LAYER_PASSES[kernels or "grouped"]
    outputs, weights = (x * act_bytes for x in traffic_elements(model, tokens, tp, ep, etp))
    return out_f * outputs + w_f * weights, out_b * outputs + w_b * weights
