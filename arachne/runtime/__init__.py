"""Run plans for real on PyTorch distributed: model parts, TP layers, 1F1B, gradient sync, launcher.

- ``layout``: the plan resolved to ranks (roles, p2p routes, parameter shards, gradient-sync and
  process groups, checkpoint writers); torch-free.
- ``model``: the GPT-style stage (Megatron column/row-parallel linears, GQA, gelu/swiglu MLP,
  top-k MoE over EP all-to-all, vocabulary-parallel head and cross-entropy).
- ``engine``: one process's training loop (1F1B/GPipe with batched isend/irecv, per-parameter
  gradient all-reduce among all holders, Adam/SGD, per-step unsharded checkpoints).
- ``launch``: one process per plan device via torch.multiprocessing on a 127.0.0.1 rendezvous;
  ``worker``: the same loop under torchrun (``arachne export --format torchrun``).
- ``reference``: single-process full-batch training every distributed run must reproduce.
- ``profiler``, ``measure``, ``export``: profiles, measured vs estimated time, Megatron/torchrun.

Not implemented: ZeRO-1 sharding of optimizer state (``zero_stage: 1`` runs replicated Adam,
numerically identical), fp16 loss scaling, gradient clipping, MoE capacity limits and auxiliary
load-balancing loss (routing is dropless), sequence parallelism.

Importing this package does not import torch; ``layout``, ``export`` and ``measure`` are
torch-free, the other modules need torch.
"""
