"""Entry point for processes started by torchrun (see ``arachne export --format torchrun``).

``python -m arachne.runtime.worker --plan P --cluster C [--node-name NODE]``: reads RANK,
WORLD_SIZE and LOCAL_RANK from torchrun's environment; with ``--node-name`` local rank ``j`` drives
that node's ``j``-th plan device, otherwise rank ``i`` drives ``plan.devices[i]``. Rank 0 prints
one JSON object per step.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from arachne.errors import InputError
from arachne.plan import Plan, load_plan, validate_plan
from arachne.runtime import checkpoint as ckpt
from arachne.runtime.engine import Worker, WorkerConfig, one_line
from arachne.runtime.flags import check_lr, check_timeout
from arachne.runtime.launch import resume_point
from arachne.spec.cluster import load_cluster
from arachne.spec.model import ModelSpec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m arachne.runtime.worker", description=__doc__)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--node-name", dest="node", default=None,
                    help="this node's name in the cluster: local rank j drives its j-th plan device")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA is available")
    a = ap.parse_args(argv)
    try:
        check_timeout(a.timeout)
        check_lr(a.lr)
        cluster = load_cluster(a.cluster)
        plan = load_plan(a.plan)
        model = validate_plan(plan, cluster, source=a.plan)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if world != len(plan.devices):
        print(f"error: {a.plan}: pipelines: the plan has {len(plan.devices)} devices, torchrun started {world}",
              file=sys.stderr)
        return 2
    if a.node:
        mine = sorted((d for d in plan.devices if d.split(":")[0] == a.node), key=lambda d: int(d.split(":")[1]))
        device = mine[local_rank]
    else:
        device = plan.devices[rank]
    with contextlib.ExitStack() as held:
        if a.checkpoint_dir and rank == 0:  # rank 0 writes the checkpoint; it holds the directory
            try:
                held.enter_context(ckpt.locked(Path(a.checkpoint_dir)))
            except InputError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        return _train(a, plan, model, rank, world, device)


def _train(a: argparse.Namespace, plan: Plan, model: ModelSpec, rank: int, world: int, device: str) -> int:
    use_cuda = torch.cuda.is_available() and not a.cpu
    if use_cuda:
        torch.cuda.set_device(int(device.split(":")[1]) % torch.cuda.device_count())
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=a.timeout))
    order: list[str] = [""] * world
    dist.all_gather_object(order, device)
    if sorted(order) != sorted(plan.devices):
        raise SystemExit(f"error: ranks map to devices {order}, not the plan's devices")
    cfg = WorkerConfig(plan=plan.to_doc(), model=model.model_dump(), order=order, steps=a.steps, seed=a.seed,
                       lr=a.lr, backend="nccl" if use_cuda else "gloo", timeout_s=a.timeout,
                       cuda_index=[int(d.split(":")[1]) % max(1, torch.cuda.device_count()) for d in order]
                       if use_cuda else None, threads=torch.get_num_threads())
    if a.checkpoint_dir:
        root = Path(a.checkpoint_dir)
        root.mkdir(parents=True, exist_ok=True)
        cfg.checkpoint_dir = str(root)
        found = resume_point(root, model)
        if found is not None:
            path, meta = found
            cfg.resume_from, cfg.start_step, cfg.start_sample = str(path), int(meta["step"]), int(meta["samples"])
            cfg.seed, cfg.extra["losses"] = int(meta["seed"]), list(meta.get("losses", []))

    def report(msg: dict) -> None:
        if msg["type"] == "step":
            print(json.dumps({k: msg[k] for k in ("step", "loss", "time_s")}), flush=True)

    try:
        Worker(rank, cfg, report).run()
        dist.barrier()
    except Exception as exc:
        print(f"error: rank {rank} ({device}): {one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
