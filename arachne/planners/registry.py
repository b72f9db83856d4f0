"""The one table of planners: a name, the class that implements it and the options that make a variant.

Adding a planner is one entry in :data:`PLANNERS` (docs/extending.md). Modules are imported only when a
planner is asked for, so ``arachne --help`` stays fast.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping

from arachne.errors import InputError
from arachne.planners.protocol import Planner


@dataclass(frozen=True)
class PlannerEntry:
    """One row of the registry."""

    target: str
    """``module:Class`` (or a factory) called with the entry's options and the caller's."""
    summary: str
    """One line for ``arachne plan --help`` and the docs."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Constructor options fixed by this entry: a variant of another planner is data, not code."""
    variant_of: str | None = None
    """The planner this entry is a variant of; variants are not listed on their own."""
    moe_only: bool = False
    """Run by default (``compare``) only for MoE models, where it differs from its base."""


_B = "arachne.planners.baselines"
_EP = {"ep_postpass": True}  # baselines blind to MoE, plus the EP post-pass (docs/baselines.md §11.6)

PLANNERS: dict[str, PlannerEntry] = {
    "arachne": PlannerEntry("arachne.planners.arachne.planner:ArachnePlanner",
                            "learned templates, completed by rule, priced by the cost model"),
    "megatron": PlannerEntry(f"{_B}.megatron:MegatronPlanner", "Megatron-LM's 3D grid, per GPU type"),
    "megatron-oblivious": PlannerEntry(f"{_B}.megatron:MegatronPlanner",  # docs/baselines.md §2.3
                                       "Megatron's grid over all GPUs as if identical", {"oblivious": True}),
    "amp": PlannerEntry(f"{_B}.amp:AMPPlanner", "AMP (NeurIPS'22): uniform (tp, dp), DP layer partition"),
    "metis": PlannerEntry(f"{_B}.metis:MetisPlanner", "Metis (ATC'24): one pipeline of device groups"),
    "flashflex": PlannerEntry(f"{_B}.flashflex:FlashFlexPlanner", "FlashFlex: graph-partitioned pipelines"),
    "sailor": PlannerEntry(f"{_B}.sailor:SailorPlanner", "Sailor (SOSP'25): heterogeneous replicas"),
    "amp+ep": PlannerEntry(f"{_B}.amp:AMPPlanner", "AMP plus the EP post-pass", _EP, "amp", True),
    "metis+ep": PlannerEntry(f"{_B}.metis:MetisPlanner", "Metis plus the EP post-pass", _EP, "metis", True),
    "flashflex+ep": PlannerEntry(f"{_B}.flashflex:FlashFlexPlanner", "FlashFlex plus the EP post-pass", _EP,
                                 "flashflex", True),
    "sailor+ep": PlannerEntry(f"{_B}.sailor:SailorPlanner", "Sailor plus the EP post-pass", _EP, "sailor", True),
    "exhaustive": PlannerEntry("arachne.planners.arachne.oracle:ExhaustivePlanner",
                               "the oracle: every template of arachne's space, priced"),
}


def _module(name: str) -> str:
    return PLANNERS[name].target.split(":")[0]


def planner_names() -> list[str]:
    """Planners (not variants) whose modules exist in this installation."""
    return [n for n, e in PLANNERS.items()
            if e.variant_of is None and importlib.util.find_spec(_module(n)) is not None]


def variants_of(name: str) -> list[str]:
    """The registered variants of planner ``name`` (e.g. its EP post-pass)."""
    return [n for n, e in PLANNERS.items() if e.variant_of == name]


def planner_factory(name: str):
    """The class (or factory) of planner ``name``; :class:`InputError` naming ``--planner`` if unknown."""
    entry = PLANNERS.get(name)
    if entry is None:
        raise InputError("", "--planner", f"unknown planner {name!r} (available: {', '.join(planner_names())})")
    module, attr = entry.target.split(":")
    return getattr(importlib.import_module(module), attr)


def get_planner(name: str, **options: Any) -> Planner:
    """A planner instance: the entry's fixed options, then the caller's."""
    factory = planner_factory(name)
    return factory(**{**PLANNERS[name].options, **options})
