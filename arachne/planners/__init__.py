"""Planners: one protocol, one registry table, one harness; every planner returns `Plan`s priced by the
one `CostModel`."""

from arachne.planners.harness import run_compare, run_planner
from arachne.planners.protocol import Planner, PlannerResult, SearchBudget, SearchStats
from arachne.planners.registry import PLANNERS, get_planner, planner_names

__all__ = ["PLANNERS", "Planner", "PlannerResult", "SearchBudget", "SearchStats", "get_planner",
           "planner_names", "run_compare", "run_planner"]
