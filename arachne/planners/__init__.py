"""Planners: one protocol, one registry; every planner returns `Plan`s priced by the one `CostModel`."""

from arachne.planners.base import (
    Planner,
    PlannerResult,
    SearchBudget,
    SearchStats,
    get_planner,
    planner_names,
    register,
    run_planner,
)

__all__ = ["Planner", "PlannerResult", "SearchBudget", "SearchStats", "get_planner", "planner_names",
           "register", "run_planner"]
