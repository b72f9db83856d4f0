"""The arachne planner's options: one frozen dataclass in sections, a docstring per field.

Production settings (:class:`TargetOptions`, :class:`SearchOptions`, :class:`TimeShares`,
:class:`CompletionOptions`) are what ``arachne plan`` runs with; :class:`AblationSwitches` only turn parts
of the planner off or replace them, for the ablation and learning benchmarks. Every field also has a flat
keyword (its own name) so ``run_planner("arachne", ..., target_s=2.0)`` and ``--options`` JSON keep working.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

BASE_TARGET_S = 0.8
"""The target of the base pass, in seconds of work (see :mod:`arachne.planners.arachne.work_clock`): a longer
target runs this pass as it is first, then spends the rest improving on its result."""
DEFAULT_TARGET_S = 1.2
"""The default latency target in seconds of work up to :data:`LARGE_CLUSTER_GPUS` GPUs: the base pass and its
extension (decision 0025)."""
LARGE_CLUSTER_GPUS = 1024
"""Past this many GPUs the default target grows in proportion to the GPUs (decision 0049)."""
MAX_DEFAULT_TARGET_S = 12.0
"""The most the default target grows to (reached at 10,240 GPUs)."""


def default_target(num_gpus: int) -> float:
    """The latency target when none is given: :data:`DEFAULT_TARGET_S`, times ``num_gpus /``
    :data:`LARGE_CLUSTER_GPUS` past that size, at most :data:`MAX_DEFAULT_TARGET_S` (a longer target only
    extends the base pass, so it never returns a slower plan)."""
    return min(MAX_DEFAULT_TARGET_S, DEFAULT_TARGET_S * max(1.0, num_gpus / LARGE_CLUSTER_GPUS))

GROUP_WITHIN = 0.97
"""Default of :attr:`CompletionOptions.group_within`."""


@dataclass(frozen=True)
class TargetOptions:
    """How long the planner aims to run."""

    target_s: float | None = None
    """The whole run aims to end by then (or by the caller's budget, if sooner). A target beyond
    :data:`BASE_TARGET_S` runs the base pass first and spends the rest improving on its result. None:
    :func:`default_target` of the cluster's GPUs."""
    clock: Literal["work", "wall"] = "work"
    """``work``: the target counts work done, so the same input gets the same plan under any load;
    ``wall``: seconds on the wall clock."""
    second_look: bool = True
    """A second search with :data:`~.portfolio.SECOND_LOOK`'s options, to the same target, in a forked process on
    the machine's other core; the faster plan of the two wins (only with the ablation switches at their defaults)."""


@dataclass(frozen=True)
class SearchOptions:
    """What the search proposes and how far it looks."""

    k: int = 24
    """Templates the learned policy proposes (its beam width)."""
    teacher_beam: int = 2
    """Beam of the priced teacher search (used when nothing else fits, and in ``teacher`` mode)."""
    min_screened: int = 8
    """Proposals screened even when the target is spent."""
    more_starts: int = 2
    """Further refinement starts when time is left (refinement is path dependent)."""
    proxy_first: int = 1
    """Mixed-class rules that the throughput proxy rates best, screened ahead of the ranker's order."""
    lead_first: bool = False
    """Screen the rule pool's lead (all classes at their joint depths) first in the base pass; off, it is
    priced first in a longer target's extension."""
    depth_rule: bool = True
    """Each device class alone at the pipeline depths a quick guess rates best."""
    parts_max_gpus: int = 512
    """Odd-sized nodes are also planned by power-of-two parts on clusters of at most this many GPUs."""
    floor_actions: int = 0
    """Per device class, the rule floor's actions kept (0: the rule's default)."""
    same_gpus_first: bool = False
    """The seeds' grid next to a one-type incumbent tries its same-GPU trades first (twice the tp at half the
    depth, and at the depth that fills the type; ``seed_scope.around_incumbent``): the second search's order."""
    whole_block_mix: bool = False
    """A last pass: the likeliest mixed rules at the replica count their whole blocks per stage free, screened
    (``search/whole_blocks.py``): the second search's."""


@dataclass(frozen=True)
class TimeShares:
    """Shares of the target spent on each phase."""

    polish_share: float = 0.15
    """Kept at the end for moving stage boundaries of the best plans."""
    teacher_share: float = 0.5
    """Of the spare time, for the priced teacher (the rest: refinement)."""
    phase1_share: float = 0.6
    """For pricing the proposals (matters on large clusters)."""
    screen_share: float = 0.5
    """For screening the proposals (a cheap first look)."""
    policy_share: float = 0.2
    """For the policy's beam search."""
    parts_share: float = 0.001
    """For the quick pass over odd-sized nodes by parts (0: whole nodes only, 1: parts only)."""
    whole_min_share: float = 0.5
    """For the search over whole nodes after the pass by parts, at least."""
    seed_share: float = 0.08
    """For the seeds' pass (the uniform grid family, ``seeds.py``) and its knobs, after the search; long sequences
    and objectives that price GPUs have their own (``seeds.seed_share``)."""


@dataclass(frozen=True)
class CompletionOptions:
    """Rules that complete a template; passed to :class:`~arachne.planners.arachne.context.PlanningContext`."""

    balance_sends: bool = True
    """A second layer split that also balances blocking sends (slow links)."""
    trim_last: bool = True
    """With fewer micro-batches than twice the stages, layers moved off the last stage while the 1F1B timeline
    of the stage times gets shorter (``split.trim_last_stage``)."""
    group_sizes: bool = True
    """A group of pipelines may take its own micro-batch size."""
    group_within: float = GROUP_WITHIN
    """... tried on templates priced within this share of the fastest plan so far."""
    by_value_prefixes: bool = True
    """The floor's "fastest j classes" also ranked by each class's value alone."""
    wide_small_batch: bool = True
    """The floor's one-stage slots across nodes for a batch smaller than a class."""
    type_pools: bool = True
    """Pipelines over one GPU type pooled across its node sizes, priced after refinement."""
    sequence_parallel: bool = True
    """Stages of tp > 1 built and sized with sequence parallelism (formats v2): in the cost model it costs no
    time (its reduce-scatter and all-gather move what the all-reduce did) and holds a tp-th of the activations
    the all-reduce replicates, so it is a rule, not a choice; every runtime preset runs it. Off with
    :attr:`AblationSwitches.modern_knobs` (version-1 plans only)."""


@dataclass(frozen=True)
class AblationSwitches:
    """Parts of the planner turned off or replaced (benchmarks only; production keeps the defaults)."""

    mode: Literal["policy", "teacher", "floor", "random"] = "policy"
    """``policy``: learned proposals (falls back to ``teacher`` when no checkpoint is shipped); ``teacher``:
    the priced beam search; ``floor``: rule templates only; ``random``: ``k`` random valid templates."""
    use_refine: bool = True
    """Priced local refinement of the best template."""
    use_floor: bool = True
    """Rule-based floor templates beside the policy's."""
    use_polish: bool = True
    """Stage-boundary polishing at the end (never in ``random`` mode)."""
    modern_knobs: bool = True
    """Formats-v2 knobs on the three best plans at the end (overlap, sequence parallelism, per-stage
    recomputation, cp, interleaving, experts, ZeRO-2/3: :mod:`~arachne.planners.arachne.completion.modern`);
    off: version-1 plans only."""
    use_ranker: bool = True
    """The learned screening order (off: the policy's own order)."""
    rank_k: int = 0
    """The learned arm alone: only the ranker's first ``rank_k`` templates (0: off)."""
    floor_k: int = 0
    """``floor`` mode: only the first ``floor_k`` rule templates (0: all)."""


_SECTIONS = {"target": TargetOptions, "search": SearchOptions, "shares": TimeShares,
             "completion": CompletionOptions, "ablation": AblationSwitches}


@dataclass(frozen=True)
class ArachneOptions:
    """Every option of the arachne planner, by section."""

    target: TargetOptions = field(default_factory=TargetOptions)
    search: SearchOptions = field(default_factory=SearchOptions)
    shares: TimeShares = field(default_factory=TimeShares)
    completion: CompletionOptions = field(default_factory=CompletionOptions)
    ablation: AblationSwitches = field(default_factory=AblationSwitches)

    def __post_init__(self) -> None:
        if self.target.clock not in ("work", "wall"):
            raise ValueError(f"clock must be 'work' or 'wall', not {self.target.clock!r}")
        if self.ablation.mode not in ("policy", "teacher", "floor", "random"):
            raise ValueError(f"mode must be policy, teacher, floor or random, not {self.ablation.mode!r}")

    @classmethod
    def from_flat(cls, **flat: Any) -> ArachneOptions:
        """Options from flat keywords (each field's own name); an unknown keyword is a ``TypeError``."""
        return cls().with_flat(**flat)

    def with_flat(self, **flat: Any) -> ArachneOptions:
        """A copy with the flat keywords ``flat`` changed."""
        changes: dict[str, dict[str, Any]] = {}
        for key, value in flat.items():
            section = FLAT_FIELDS.get(key)
            if section is None:
                raise TypeError(f"unknown arachne planner option {key!r}")
            changes.setdefault(section, {})[key] = value
        return replace(self, **{s: replace(getattr(self, s), **c) for s, c in changes.items()})

    def flat(self) -> dict[str, Any]:
        """Every field by its flat name (for reports and JSON)."""
        return {f.name: getattr(getattr(self, s), f.name) for s, t in _SECTIONS.items() for f in fields(t)}


FLAT_FIELDS: dict[str, str] = {f.name: s for s, t in _SECTIONS.items() for f in fields(t)}
"""Flat keyword -> the section that holds it (names are unique across sections)."""
assert len(FLAT_FIELDS) == sum(len(fields(t)) for t in _SECTIONS.values())
