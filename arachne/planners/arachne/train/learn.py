"""Train the policy MLP in torch on teacher records; export plain numpy weights.

Loss: for each decision, cross-entropy between the policy's softmax over the valid actions and
a target that puts the teacher's (cost-model) reward on each action: softmax((v / v_max - 1) / tau).
With a small ``tau`` this imitates the teacher's best action and ranks the near-misses after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arachne.planners.arachne.learned.policy import Policy
from arachne.planners.arachne.train.teacher import Record


@dataclass
class TrainConfig:
    hidden: int = 128
    layers: int = 2
    epochs: int = 40
    lr: float = 2e-3
    weight_decay: float = 1e-3
    tau: float = 0.05
    batch_decisions: int = 256
    seed: int = 0


def _pack(records: list[Record], tau: float):
    xs, tg, seg = [], [], []
    for i, r in enumerate(records):
        v = r.values / r.values.max()
        q = np.exp((v - 1) / tau)
        q /= q.sum()
        xs.append(r.x)
        tg.append(q)
        seg.append(np.full(len(v), i))
    return np.concatenate(xs), np.concatenate(tg), np.concatenate(seg)


def train_policy(train: list[Record], val: list[Record], cfg: TrainConfig, info: dict,
                 log=None) -> tuple[Policy, list[dict]]:
    """Fit the MLP; returns the numpy policy and the per-epoch training curve."""
    import torch

    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    X, Q, S = _pack(train, cfg.tau)
    mean, std = X.mean(0), X.std(0) + 1e-6
    dims = [X.shape[1]] + [cfg.hidden] * cfg.layers + [1]
    mods: list = []
    for i in range(len(dims) - 1):
        mods.append(torch.nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            mods.append(torch.nn.Tanh())
    net = torch.nn.Sequential(*mods)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    norm = lambda a: torch.tensor((a - mean) / std, dtype=torch.float32)  # noqa: E731

    def loss_of(x: np.ndarray, q: np.ndarray, seg: np.ndarray) -> tuple:
        z = net(norm(x))[:, 0]
        seg_t = torch.tensor(seg, dtype=torch.long)
        n = int(seg.max()) + 1
        zmax = torch.full((n,), -1e30).scatter_reduce(0, seg_t, z.detach(), reduce="amax")
        ez = torch.exp(z - zmax[seg_t])
        lse = torch.log(torch.zeros(n).index_add(0, seg_t, ez)) + zmax
        logp = z - lse[seg_t]
        qt = torch.tensor(q, dtype=torch.float32)
        loss = -(qt * logp).sum() / n
        # top-1 agreement with the teacher's best action
        best_pred = torch.full((n,), -1e30).scatter_reduce(0, seg_t, z.detach(), reduce="amax")
        best_q = torch.zeros(n).scatter_reduce(0, seg_t, qt, reduce="amax")
        hit = ((z.detach() == best_pred[seg_t]) & (qt == best_q[seg_t])).float()
        acc = torch.zeros(n).index_add(0, seg_t, hit).clamp(max=1).mean()
        return loss, float(acc)

    Xv, Qv, Sv = _pack(val, cfg.tau) if val else (None, None, None)
    curve = []
    best_state, best_val = None, float("inf")
    n_dec = len(train)
    starts = np.searchsorted(S, np.arange(n_dec + 1))
    for epoch in range(cfg.epochs):
        order = rng.permutation(n_dec)
        tot, accs = 0.0, []
        for b0 in range(0, n_dec, cfg.batch_decisions):
            ids = np.sort(order[b0:b0 + cfg.batch_decisions])
            rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in ids])
            seg = np.repeat(np.arange(len(ids)), [starts[i + 1] - starts[i] for i in ids])
            loss, acc = loss_of(X[rows], Q[rows], seg)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(ids)
            accs.append(acc)
        row = {"epoch": epoch, "train_loss": tot / n_dec, "train_top1": float(np.mean(accs))}
        if Xv is not None:
            with torch.no_grad():
                vl, va = loss_of(Xv, Qv, Sv)
            row.update(val_loss=float(vl), val_top1=va)
        curve.append(row)
        if log:
            log(row)
        score = row.get("val_loss", row["train_loss"])
        if score < best_val:  # early stopping: keep the epoch that generalises best
            best_val = score
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    if best_state is not None:
        net.load_state_dict(best_state)
    layers = []
    for m in net:
        if isinstance(m, torch.nn.Linear):
            layers.append((m.weight.detach().numpy().T.astype(np.float32).copy(),
                           m.bias.detach().numpy().astype(np.float32).copy()))
    return Policy(layers, mean.astype(np.float32), std.astype(np.float32), info), curve
