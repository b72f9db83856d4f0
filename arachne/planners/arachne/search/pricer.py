"""The pricer: completes and prices templates through the cost model, caching by template, and keeps the
best priced plans seen so far (what every search strategy shares)."""

from __future__ import annotations

from dataclasses import dataclass, field

from arachne.cost import Estimate
from arachne.plan import Plan
from arachne.planners.arachne.actions import (
    State,
)
from arachne.planners.arachne.completion.price import price_template
from arachne.planners.arachne.context import PlanningContext
from arachne.planners.arachne.template import (
    Template,
)


@dataclass
class Pricer:
    """Prices templates through completion, once each."""

    ctx: PlanningContext
    max_priced: int | None = 2  # candidates priced per template (None: every micro-batch size)
    cache: dict[Template, tuple[Plan, Estimate] | None] = field(default_factory=dict)
    states: dict[Template, State] = field(default_factory=dict)
    visited: dict[State, float] = field(default_factory=dict)  # every decision sequence priced
    screened: dict[Template, tuple[Plan, Estimate] | None] = field(default_factory=dict)

    def price_state(self, st: State) -> float:
        tpl = st.template()
        self.states.setdefault(tpl, st)
        v = self.visited[st] = self.throughput(tpl)
        return v

    def __call__(self, tpl: Template) -> tuple[Plan, Estimate] | None:
        if not tpl.groups:
            return None
        if tpl not in self.cache:
            self.cache[tpl] = (price_template(tpl, self.ctx, max_priced=self.max_priced)
                               if tpl.fits_counts(self.ctx.classes) else None)
        return self.cache[tpl]

    def throughput(self, tpl: Template) -> float:
        r = self(tpl)
        return r[1].tokens_per_s if r else 0.0

    def screen_state(self, st: State) -> float:
        """A cheap lower bound of :meth:`price_state` (see ``price_template(screen=True)``); the screened
        plan is a real priced plan and stays a candidate."""
        tpl = st.template()
        self.states.setdefault(tpl, st)
        if tpl in self.cache:
            r = self.cache[tpl]
        else:
            if tpl not in self.screened:
                self.screened[tpl] = (price_template(tpl, self.ctx, screen=True)
                                      if tpl.groups and tpl.fits_counts(self.ctx.classes) else None)
            r = self.screened[tpl]
        return r[1].tokens_per_s if r else 0.0

    def results(self) -> list[tuple[Plan, Estimate]]:
        """Every distinct priced plan (fully priced, or screened and not priced in full since)."""
        out, seen = [], set()
        for _, r in (*self.cache.items(), *((t, r) for t, r in self.screened.items() if t not in self.cache)):
            if r is None:
                continue
            key = (r[1].iteration_time_s, r[0].micro_batch_size, len(r[0].pipelines))  # equal plans price equally
            if key not in seen:
                seen.add(key)
                out.append(r)
        return out

    def best(self) -> tuple[Template, Plan, Estimate] | None:
        items = [(t, r) for t, r in (*self.screened.items(), *self.cache.items()) if r is not None]
        if not items:
            return None
        t, (p, e) = max(items, key=lambda x: x[1][1].tokens_per_s)
        return t, p, e
