"""An upper bound on the throughput of any plan the cost model can price: the compute ceiling.

Every GPU computes all the time, each part of the model (embedding, each block, head) runs at
the best GPU-seconds per token the cost model gives it on that GPU type over every tp, micro-batch
size and ep, and the parts are shared among the GPU types as well as a linear programme can. No
communication, bubble, recompute, optimizer step or memory limit is charged, so no plan's estimate
can exceed it. It tells how far from the machine's limit a plan (or a baseline) is, and so how much
any planner could still gain on a case.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arachne.cost.model import CostModel
from arachne.spec.model import ModelSpec


@dataclass(frozen=True)
class Ceiling:
    """The bound, and per GPU type the tokens/s that type would reach alone on the whole model."""

    tokens_per_s: float
    alone_tokens_per_s: dict[str, float]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _sizes(gbs: int, measured: list[int]) -> list[int]:
    sizes = {gbs, *[m for m in measured if m <= gbs]}
    b = 1
    while b <= gbs:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


def part_seconds_per_token(cm: CostModel, model: ModelSpec, gpu_name: str, gbs: int, seq: int,
                           precision: str) -> np.ndarray:
    """GPU-seconds per token of each part (embedding, blocks..., head) at its best (tp, b, ep).

    Per-token time falls with the micro-batch in the analytic model and is piecewise linear
    between measured sizes in profiles, so the measured sizes, the powers of two and ``gbs``
    itself cover the minimum over every micro-batch a plan can give a group.
    """
    gpu = cm.cluster.gpu_types[gpu_name]
    if precision == "fp8" and gpu.fp8_tflops is None:  # fp8 plans run only on FP8 GPUs: the others in bf16
        precision = "bf16"
    heads = model.num_attention_heads
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if heads % t == 0]
    eps = _divisors(model.num_experts) if model.is_moe else [1]
    pset = cm.profiles.get(model.name, gpu.name, precision) if cm.profiles is not None else None
    best = np.full(model.num_layers + 2, np.inf)
    for tp in tps:
        measured = list(pset._mbs.get(tp, [])) if pset is not None and pset.has_tp(tp) else []
        for b in _sizes(gbs, measured):
            for ep in eps:
                lc = cm.layer_costs(model, gpu, precision, seq, float(b), tp, ep)
                blocks = np.diff(lc.fwd_cum) + np.diff(lc.bwd_cum)
                parts = np.concatenate([[lc.emb_fwd + lc.emb_bwd], blocks, [lc.head_fwd + lc.head_bwd]])
                best = np.minimum(best, parts * tp / (b * seq))
    return best


def throughput_ceiling(cm: CostModel, model: ModelSpec, global_batch_size: int, sequence_length: int,
                       precision: str = "bf16") -> Ceiling:
    """The largest tokens/s the cluster could reach on the model under the cost model's compute times.

    Linear programme: maximise X subject to, for every part p, sum_g y[g, p] = X, and for every GPU
    type g, sum_p y[g, p] * t[g, p] <= count[g] (y: tokens/s of part p done on type g).
    """
    from scipy.optimize import linprog

    counts = cm.cluster.gpu_counts
    names = sorted(counts)
    t = np.array([part_seconds_per_token(cm, model, g, global_batch_size, sequence_length, precision)
                  for g in names])
    G, P = t.shape
    alone = {g: float(counts[g] / t[i].sum()) for i, g in enumerate(names)}
    # variables: y[g, p] (G*P of them, row-major), then X
    n = G * P + 1
    c = np.zeros(n)
    c[-1] = -1.0
    a_eq = np.zeros((P, n))
    for p in range(P):
        a_eq[p, [g * P + p for g in range(G)]] = 1.0
        a_eq[p, -1] = -1.0
    a_ub = np.zeros((G, n))
    for g in range(G):
        a_ub[g, g * P:(g + 1) * P] = t[g]
    b_ub = np.array([counts[g] for g in names], dtype=float)
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(P), bounds=[(0, None)] * n, method="highs")
    if res.status != 0:
        raise RuntimeError(f"compute ceiling: the linear programme failed ({res.message})")
    return Ceiling(tokens_per_s=float(res.x[-1]), alone_tokens_per_s=alone)
