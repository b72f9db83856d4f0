"""Whether a model can fit a cluster at all, and the message that says by how much it does not."""

from __future__ import annotations

from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec


def model_state_bounds(cluster: Cluster, model: ModelSpec, job: Job) -> tuple[float, float]:
    """(bytes any plan needs at least: one copy of weights, gradients and optimizer state plus each GPU's
    runtime overhead, bytes the cluster has); a plan on fewer GPUs saves their overhead and loses more."""
    from arachne.cost.calibration import DEFAULT_CALIBRATION
    from arachne.cost.memory import state_bytes_per_param

    cal = DEFAULT_CALIBRATION.memory
    w, g, o = state_bytes_per_param(job.precision, cal)
    extra = cal.fp32_grad_buffer if job.precision == "fp32" else 0.0
    overhead = (cal.fp32_overhead_bytes if job.precision == "fp32" else cal.mixed_overhead_bytes) * cluster.num_gpus
    return model.num_params * (w + g + o + extra) + overhead, cluster.total_memory_bytes


def memory_shortfall_message(cluster: Cluster, model: ModelSpec, job: Job, planner: str,
                             closest: str | None = None, timed_out: bool = False) -> str:
    """Why nothing fits, with numbers: the model state against the cluster's memory, or the nearest miss."""
    need, have = model_state_bounds(cluster, model, job)
    if need > have:
        return (f"no plan fits: {model.name} needs at least {need / 1e9:.0f} GB for weights, gradients, optimizer "
                f"state ({job.precision}, Adam, one copy even with ZeRO-1) and per-GPU runtime overhead, but the "
                f"cluster has {have / 1e9:.0f} GB in total (short by {(need - have) / 1e9:.0f} GB)")
    why = f"; {closest}" if closest else ""
    budget = " within the time budget" if timed_out else ""
    return (f"{planner} found no plan that fits in memory{budget}: the model state needs {need / 1e9:.0f} GB of the "
            f"cluster's {have / 1e9:.0f} GB, but no layout it tried keeps every GPU under its capacity with "
            f"activations for micro-batches of {job.sequence_length} tokens{why}")
