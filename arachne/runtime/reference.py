"""Single-process, full-batch reference training: what every distributed run must reproduce."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from arachne.runtime.model import ParamStore, StageModel, synthetic_tokens
from arachne.spec.model import ModelSpec


@dataclass
class ReferenceResult:
    losses: list[float]
    params: dict[str, Tensor]
    exp_avg: dict[str, Tensor]


def reference_run(model: ModelSpec, global_batch_size: int, sequence_length: int, steps: int, seed: int = 0,
                  lr: float = 1e-3, optimizer: str = "adam", threads: int | None = 1) -> ReferenceResult:
    """Train the whole model on one process, one full-batch step per iteration (fp32, CPU).

    ``threads`` (restored afterwards): one by default, as intra-op threading only adds overhead
    on the tiny models this is meant for.
    """
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _reference(model, global_batch_size, sequence_length, steps, seed, lr, optimizer)
    finally:
        torch.set_num_threads(before)


def _reference(model: ModelSpec, global_batch_size: int, sequence_length: int, steps: int, seed: int, lr: float,
               optimizer: str) -> ReferenceResult:
    store = ParamStore(model, seed, torch.device("cpu"), tie=True)
    net = StageModel(model, (0, model.num_layers), True, True, store)
    params = [p for _, p in store.entries]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt: torch.optim.Optimizer = (torch.optim.SGD(params, lr=lr) if optimizer == "sgd"
                                  else torch.optim.Adam(params, lr=lr))
    losses = []
    tokens_per_step = global_batch_size * sequence_length
    for step in range(steps):
        for p in params:
            p.grad.zero_()  # type: ignore[union-attr]
        tok = synthetic_tokens(seed, step * global_batch_size, (step + 1) * global_batch_size, sequence_length,
                               model.vocab_size)
        loss = net(tok[:, :-1], tok[:, 1:]) / tokens_per_step
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    full = {s.name: p.detach().clone() for s, p in store.entries}
    moments = {s.name: opt.state[p]["exp_avg"].clone() for s, p in store.entries if "exp_avg" in opt.state.get(p, {})}
    return ReferenceResult(losses, full, moments)
