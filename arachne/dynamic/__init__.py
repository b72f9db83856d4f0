"""Re-planning when the cluster changes: the new plan, and what moving to it costs."""

from arachne.dynamic.migration import Migration, migration_cost
from arachne.dynamic.replan import ReplanResult, replan

__all__ = ["Migration", "ReplanResult", "migration_cost", "replan"]
