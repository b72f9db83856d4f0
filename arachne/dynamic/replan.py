"""Re-planning a running job for a changed cluster (GPUs lost or added)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arachne.cost import CostModel, Estimate
from arachne.dynamic.migration import Migration, migration_cost
from arachne.plan import Plan, plan_errors
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import Cluster
from arachne.spec.model import ModelSpec


@dataclass(frozen=True)
class ReplanResult:
    """The plan to run on the changed cluster, and how it compares with staying on the old one."""

    plan: Plan
    estimate: Estimate
    planning_time_s: float
    kept_old: bool                 # the old plan still runs and nothing planned beats it
    old_problem: str | None        # why the old plan cannot run on the new cluster (None: it can)
    old_estimate: Estimate | None  # the old plan priced on the new cluster, when it still runs there
    migration: Migration

    @property
    def break_even_iterations(self) -> float | None:
        """Iterations after which moving to the new plan has paid for its transfers (old plan still valid)."""
        if self.old_estimate is None or self.kept_old:
            return None
        saved = self.old_estimate.iteration_time_s - self.estimate.iteration_time_s
        return self.migration.seconds / saved if saved > 0 else None

    def to_doc(self) -> dict[str, Any]:
        return {"plan": self.plan.to_doc(), "estimate": self.estimate.to_doc(details=False),
                "planning_time_s": self.planning_time_s, "kept_old": self.kept_old,
                "old_problem": self.old_problem,
                "old_estimate": self.old_estimate.to_doc(details=False) if self.old_estimate else None,
                "migration": self.migration.to_doc(), "break_even_iterations": self.break_even_iterations}


def replan(old: Plan, cluster: Cluster, budget: SearchBudget = SearchBudget(), planner: str = "arachne",
           cost_model: CostModel | None = None, model: ModelSpec | None = None, **options: Any) -> ReplanResult:
    """Plan the old plan's job (model, batch, sequence, precision) on ``cluster``; keep the old plan when
    it still runs there and nothing planned is faster. Raises ``NoFeasiblePlanError`` when nothing fits."""
    model = model or old.resolve_model()
    cm = cost_model or CostModel(cluster)
    errs = plan_errors(old, cluster, model)
    problem = f"{errs[0][0]}: {errs[0][1]}" if errs else None
    old_est = None
    if not errs:
        old_est = cm.estimate(old, validate=False)
        if not old_est.fits:
            problem, old_est = "it no longer fits in the GPUs' memory", None
    plan, est, res = run_planner(planner, cluster, model, old.job, cm, budget, **options)
    kept = old_est is not None and old_est.tokens_per_s >= est.tokens_per_s
    if kept:
        plan, est = old, old_est
    return ReplanResult(plan, est, res.stats.wall_time_s, kept, problem, old_est,
                        migration_cost(old, plan, model, cluster, cm.cal.memory))
