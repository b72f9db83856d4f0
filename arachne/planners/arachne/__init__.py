"""The arachne planner: templates, rule completion, priced candidates and a learned policy."""

from arachne.planners.arachne.planner import ArachnePlanner

__all__ = ["ArachnePlanner"]
