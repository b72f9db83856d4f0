"""Constants of the analytic cost model, each with where it comes from.

The compute constants are fitted by ``python -m benchmarks cost-model calibrate`` to the per-block
forward/backward times Sailor measured (data/sailor/profiles_simulator.json, fp32/TF32,
7 GPU types, 4 models) and then frozen here; rerun the script to refit. Memory constants come
from Sailor's per-layer memory measurements (layer_memory.json, layer_peak_memory_varuna.json).
"""

from __future__ import annotations

from dataclasses import dataclass


# Maximum achievable matmul throughput over the dense peak, by GPU generation and precision: the best
# large-GEMM TFLOPS measured with mamf-finder (stas00/ml-engineering, compute/accelerator "Maximum Achievable
# Matmul FLOPS comparison table" and its H200 vs B200 page; torch/cuBLAS, BF16 or FP8 inputs, no sparsity):
# A100 SXM 267.9/312 bf16; H100 SXM 792.1/989 bf16, H200 1453.4/1979 fp8; B200 1745.0/2250 bf16,
# 3432.5/4500 fp8; MI300X 781.9/1300 bf16. These are component measurements (no training run is fitted).
MATMUL_EFFICIENCY: dict[tuple[str, str], float] = {
    ("ampere", "bf16"): 267.9 / 312,
    ("hopper", "bf16"): 792.1 / 989,
    ("hopper", "fp8"): 1453.4 / 1979,
    ("blackwell", "bf16"): 1745.0 / 2250,
    ("blackwell", "fp8"): 3432.5 / 4500,
    ("cdna3", "bf16"): 781.9 / 1300,
}


# Memory traffic of an MoE layer beyond its GEMMs (arachne/cost/moe_layer.py), per implementation class: passes
# over the expert GEMMs' output elements and over the local experts' weights, forward then backward, at the
# activation type's width. Fitted (``python -m benchmarks cost-model moe-layer --fit``) on whole-layer H100 bf16
# measurements of Megatron-Core's MoE layer (grouped) and SonicMoE's (fused), the 7B and 30B panels of
# SonicMoE's Figure 14 (data/components/moe_layer.yaml); its 1.4B and 120B panels check them. Component
# measurements: no training run is fitted.
MOE_LAYER_PASSES: dict[str, tuple[float, float, float, float]] = {
    "grouped": (11.2, 3.6, 26.4, 5.6),
    "fused": (1.7, 2.0, 2.3, 5.2),
}


# While a micro-batch's expert all-to-alls overlap another's compute (a plan's ``overlap_moe_comm``), the
# dispatcher's kernels hold SMs the GEMMs then lack: Megatron-Core gives DeepEP 20 SMs by default
# (``moe_deepep_num_sms``, TransformerConfig; HybridEP 16) of an H100's 132, so the overlapped compute runs at
# 112/132 of its rate. A framework default and a GPU's SM count, not a fit.
MOE_OVERLAP_SM_SHARE: float = 20 / 132


@dataclass(frozen=True)
class ComputeCalibration:
    """Achieved matmul throughput = peak * e * w / (w + w_half), w = FLOPs per GEMM; e is the measured
    maximum-achievable fraction of the GPU generation at the precision (``MATMUL_EFFICIENCY``; fp16 reads the
    bf16 figure) and ``e_max`` where none was measured (fitted on Sailor's fp32/TF32 profiles)."""

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
    """What NCCL achieves on each fabric (docs/cost-model.md, "Network"; data/nccl/README.md).

    NIC efficiencies: bus bandwidth NCCL reaches over a node's NICs / their line rate (``inter_node_gbps``).
    Sources are maintainers' statements in public threads, except ``efa_nic_efficiency``: fitted on the
    calibration half of data/nccl/measurements.json (``held_out: false``, not degraded, sizes >= 64 MiB;
    ``python -m benchmarks cost-model collectives`` prints the refit), never on the check half."""

    intra_node_latency_s: float = 10e-6
    inter_node_latency_s: float = 30e-6
    all_reduce_bucket_bytes: float = 25e6 * 4   # gradient buckets (Megatron default 40M params)
    # InfiniBand: "24GB/s is the peak performance per 200G NIC (12 GB/s for 100G NICs)" (S. Jeaugey,
    # NVIDIA/nccl-tests#119, 2022-11-17); "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NVIDIA/nccl-tests
    # #290, 2025-03-03): 24/25 = 0.96, 46-48/50 = 0.92-0.96.
    infiniband_nic_efficiency: float = 0.96
    # RoCE with ConnectX-7: "should achieve up to 48-49GB/s per NIC" at 400 Gb/s (NVIDIA/nccl-tests#267,
    # 2025-01-23, a 6-node 8x400G RoCE cluster): 48/50.
    roce_nic_efficiency: float = 0.96
    # AWS EFA (aws-ofi-nccl): fitted on the calibration records (efa-p4d-4x8-allreduce-1gib: 0.595).
    efa_nic_efficiency: float = 0.595
    # Plain Ethernet, NCCL's socket transport: Sailor measured 2.86 GB/s on 25 GbE (3.125 GB/s line rate;
    # arachne/data/gpus.yaml, RTX nodes of the MIT cluster): 0.915.
    ethernet_nic_efficiency: float = 0.915
    # A node document that names no ``network``: taken as InfiniBand (most multi-node GPU clusters).
    unspecified_nic_efficiency: float = 0.96
    # NVLink SHARP (NVLS) all-reduce on NVSwitch boards of Hopper and Blackwell: algbw / NVLink line rate per
    # direction. "On 8 GPUs, you should reach a peak busBw of ~480GB/s (algbw ~275GB/s)" on H100, line rate
    # 450 GB/s (S. Jeaugey, NVIDIA/nccl-tests#212, 2024-05-06): 275/450.
    nvls_algbw_over_line: float = 0.61
    # NVLS is no faster than the ring up to 4 GPUs ("Busbw remains about 365-370 GBps when gpus from 2 to 4",
    # 8x H100 SXM, NVIDIA/nccl#1455, 2024-09-19).
    nvls_min_ranks: int = 5
    nvls_generations: tuple[str, ...] = ("hopper", "blackwell")
    nvls_min_board_gpus: int = 8          # HGX / NVL boards (NVSwitch); smaller NVLink nodes (GH200 x4) have none
    # NCCL's tree all-reduce on two nodes crosses each node's NICs with the buffer once (the ring: 2(n-1)/n
    # times), so its busbw can exceed the NIC rate (S. Jeaugey, NVIDIA/nccl-tests#196, 2024-02-05). Its
    # intra-node chain reaches at most this share of the ring's intra-node bandwidth: NCCL's own tuning model
    # converts a tree's bus bandwidth to algorithm bandwidth with 0.5 x 0.92 (src/graph/tuning.cc).
    tree_intra_share: float = 0.46
    tree_max_nodes: int = 2
    # Ring collectives (all-reduce, all-gather, reduce-scatter): a fixed start plus one step latency per ring step,
    # 2(n-1) steps for an all-reduce of which 2(N-1) cross nodes. NCCL's own tuning model, Simple protocol:
    # baseLat 8.4 us, hwLat ring NVLink 3.4 us, network 9.6 us (src/graph/tuning.cc, NCCL 2.8-era table). The
    # 10/30 us latencies above stay for point-to-point sends.
    ring_base_latency_s: float = 8.4e-6
    ring_step_latency_intra_s: float = 3.4e-6
    ring_step_latency_inter_s: float = 9.6e-6
    # NVLS on other NVSwitch generations: NCCL's own tuning model scales NVLS bandwidth by an efficiency per
    # architecture, Hopper 0.85 and Blackwell 0.74 (``nvlsEfficiency``, NCCL src/graph/tuning.cc; its tuning-model
    # header in later releases); the Hopper ``nvls_algbw_over_line`` above is scaled by their ratio.
    nvls_efficiency: tuple[tuple[str, float], ...] = (("hopper", 0.85), ("blackwell", 0.74))
    # Send/recv and all-to-all run on NCCL's p2p channels (``NCCL_MAX_P2P_NCHANNELS``), not the ring's
    # (S. Jeaugey, NVIDIA/nccl#1598): inside a node they reach this share of the ring's bandwidth. Fitted on the
    # calibration half of data/nccl/measurements.json (single-node send/recv and all-to-all records, sizes >= 64 MiB;
    # ``python -m benchmarks cost-model collectives`` prints the refit), never on the check half.
    p2p_intra_share: float = 0.84
    # All-to-all latency: NCCL posts every peer's send and receive at once (grouped p2p), so the peers' latencies
    # overlap; what remains is a per-peer cost (a step per peer on the channels) and, across nodes, a start (the
    # network proxy). Fitted on the calibration half of data/nccl/measurements.json (all-to-all records, sizes
    # >= 1 MB; ``python -m benchmarks cost-model collectives`` prints the refit), never on the check half.
    a2a_base_latency_inter_s: float = 120e-6
    a2a_peer_latency_inter_s: float = 7e-6
    a2a_peer_latency_intra_s: float = 3.25e-6


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
    # mixed precision as Megatron-LM keeps it (zero_stage 0-2): bf16 weights 2, fp32 main gradients 4
    # (``accumulate_allreduce_grads_in_fp32`` is forced on for bf16, megatron/training/arguments.py), fp32
    # master weights 4 + Adam m, v 8 = 12; the distributed optimizer (ZeRO-1) shards the 12, ZeRO-2 also
    # the 4 (Megatron-LM docs, distributed optimizer: "6 + 12/d" bytes per parameter).
    mixed_weight: float = 2.0
    mixed_grad: float = 4.0
    mixed_optimizer: float = 12.0
    # zero_stage 3 = FSDP with mixed precision (torchtitan / llm-foundry: fp32 sharded parameters, fp32
    # sharded gradients, Adam m, v; bf16 compute copies gathered per block): 4 + 4 + 8 over the replicas.
    fsdp_weight: float = 4.0
    fsdp_grad: float = 4.0
    fsdp_optimizer: float = 8.0
    # blocks whose gathered 16-bit parameters are alive at once (FSDP2 prefetches the next block's
    # all-gather while the current one computes), and per parameter of the block in backward its unsharded
    # 16-bit gradient 2 plus the fp32 reduce-scatter input 4 (``reduce_dtype`` fp32)
    fsdp_gathered_blocks: float = 2.0
    fsdp_unsharded_grad_bytes: float = 6.0
    # FSDP in a pipeline (more than one stage: torchtitan keeps parameters gathered between forward and
    # backward and accumulates gradients unsharded over the micro-batches, reducing after the last): the
    # stage's unsharded gradients per parameter, fp32 (the reduce dtype; an upper bound if kept in bf16)
    fsdp_pipeline_grad_bytes: float = 4.0
    # fixed per-GPU memory outside the allocator's tensors: CUDA context, cuBLAS/cuDNN workspaces, NCCL
    # buffers, loaded kernels. fp32: Sailor's measured 5.06 GB on GH200 (4.76 GB kernel loading + 0.3 GB);
    # mixed precision (Megatron-core): 1.5 GB.
    fp32_overhead_bytes: float = 5.06e9
    mixed_overhead_bytes: float = 1.5e9
    allocator_reserve: float = 0.03       # caching-allocator fragmentation, fraction of dynamic memory
    # fp32 (Megatron-DeepSpeed, materialised scores) activations kept per block per sequence, in elements
    # x (s*h): 3 replicated + the parallel part; checked against Sailor's layer_memory.json (OPT-350, 5%)
    act_replicated_sh: float = 3.0
    # 16-bit activations outside the tp-split GEMMs per token, in elements x h. Megatron/Transformer Engine:
    # both norms keep their input and their output (the next GEMM's input) = 4 (Korthikanti et al. 2022's
    # 10 s b h bytes without the two 1-byte dropout masks). Plain torch (FSDP runs): torch's composite
    # RMSNorm keeps 4 h of its own (fp32 input copy, normalised tensor) besides its output, twice = 10;
    # a LayerNorm keeps its input, as with Megatron. Counted by ``python -m benchmarks cost-model activations``.
    act_norm_sh_megatron: float = 4.0
    act_norm_sh_torch_rms: float = 10.0
    dropout_mask_bytes: float = 2.0       # the two 1-byte (bool) dropout masks per token x h, when dropout runs
    # backward workspace of one block without flash attention: score-sized buffers
    score_transient_copies: float = 3.0
    # logits on the last stage, bytes per element of the (vocab-parallel) logits at the loss's peak.
    # fp32: 4 fp32 logits-sized buffers. Megatron's vocab-parallel cross entropy: the bf16 logits 2 while it
    # makes its fp32 copy 4, which it turns into the softmax in place and keeps for backward (the gradient
    # is written into it) = 6. Plain torch (F.cross_entropy on fp32 logits): at the start of backward the
    # saved log-softmax 4, the nll gradient 4 and the log-softmax gradient 4 = 12.
    head_transient_copies: float = 4.0
    logit_bytes_megatron: float = 6.0
    logit_bytes_torch: float = 12.0
    optimizer_bytes_per_param_fp32: float = 28.0   # HBM traffic of an Adam step per parameter
    optimizer_bytes_per_param_mixed: float = 34.0
    optimizer_hbm_efficiency: float = 0.7


@dataclass(frozen=True)
class Calibration:
    compute: ComputeCalibration = ComputeCalibration()
    network: NetworkCalibration = NetworkCalibration()
    memory: MemoryCalibration = MemoryCalibration()


DEFAULT_CALIBRATION = Calibration()
