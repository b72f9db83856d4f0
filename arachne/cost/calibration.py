"""Constants of the analytic cost model, each with where it comes from.

The compute constants are fitted by ``python -m benchmarks cost-model calibrate`` to the per-block
forward/backward times Sailor measured (data/sailor/profiles_simulator.json, fp32/TF32,
7 GPU types, 4 models) and then frozen here; rerun the script to refit. Memory constants come
from Sailor's per-layer memory measurements (layer_memory.json, layer_peak_memory_varuna.json).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ComputeCalibration:
    """Achieved matmul throughput = peak * e_max * w / (w + w_half), w = FLOPs per GEMM."""

    e_max: float = 0.84
    w_half: float = 1.0e6
    elementwise_passes: float = 93.0     # activation-sized HBM read/writes per block forward (x s*h*b)
    replicated_fraction: float = 0.3   # share of that work not split by TP (norms, residuals)
    score_passes: float = 8.9            # score-matrix HBM passes per block forward without flash attention
    kernel_launch_s: float = 1.04e-5        # per kernel
    kernels_per_block_fwd: int = 24
    bwd_over_fwd: float = 2.0


@dataclass(frozen=True)
class NetworkCalibration:
    intra_node_latency_s: float = 10e-6
    inter_node_latency_s: float = 30e-6
    all_reduce_bucket_bytes: float = 25e6 * 4   # gradient buckets (Megatron default 40M params)


@dataclass(frozen=True)
class MemoryCalibration:
    """Bytes per parameter and fixed overheads."""

    # fp32 Adam as Megatron-DeepSpeed runs it (the only fp32 framework in the measured data): weights 4 +
    # grads 4 + Adam m, v 8, plus a flattened gradient buffer 4 and DeepSpeed's extra fp32 copy 4 -- the
    # 24 B/param Sailor's simulator charges and validates on GH200 (eth-easl/sailor; docs/catalog.md §3).
    # A single layer without data parallelism measures 16.3 B/param (layer_peak_memory_varuna.json).
    fp32_weight: float = 4.0
    fp32_grad: float = 4.0
    fp32_optimizer: float = 8.0
    fp32_grad_buffer: float = 8.0
    # mixed precision (ZeRO paper accounting): 16-bit weights 2 and grads 2, fp32 master + m + v 12.
    mixed_weight: float = 2.0
    mixed_grad: float = 2.0
    mixed_optimizer: float = 12.0
    # fixed per-GPU memory outside the allocator's tensors: CUDA context, cuBLAS/cuDNN workspaces, NCCL
    # buffers, loaded kernels. fp32: Sailor's measured 5.06 GB on GH200 (4.76 GB kernel loading + 0.3 GB);
    # mixed precision (Megatron-core): 1.5 GB.
    fp32_overhead_bytes: float = 5.06e9
    mixed_overhead_bytes: float = 1.5e9
    allocator_reserve: float = 0.03       # caching-allocator fragmentation, fraction of dynamic memory
    # activations kept per block per sequence, in elements x (s*h): 3 replicated + parallel part
    act_replicated_sh: float = 3.0
    # backward workspace of one block without flash attention: score-sized buffers
    score_transient_copies: float = 3.0
    head_transient_copies: float = 4.0    # logits-sized fp32 buffers while computing the loss
    optimizer_bytes_per_param_fp32: float = 28.0   # HBM traffic of an Adam step per parameter
    optimizer_bytes_per_param_mixed: float = 34.0
    optimizer_hbm_efficiency: float = 0.7


@dataclass(frozen=True)
class Calibration:
    compute: ComputeCalibration = ComputeCalibration()
    network: NetworkCalibration = NetworkCalibration()
    memory: MemoryCalibration = MemoryCalibration()


DEFAULT_CALIBRATION = Calibration()
