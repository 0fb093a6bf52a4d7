"""The Spark half of each window kind: one plan class per kind plans a run's batches' partials.

It assigns the rows of the SQL's output to their open windows, splits off the late ones and
pre-aggregates one partial per (window, group), by the rules of the kind's driver-side module
(``ematix_dagster.streaming.kinds``).
"""

from __future__ import annotations

from typing import Callable

from pyspark.sql import Column

from ematix_dagster.spark.plans.windows import fixed_plan, session_plan, sliding_plan
from ematix_dagster.spark.plans.windows.kind_plan import Aggregates, PartialPlan, WindowedFrames
from ematix_dagster.spec import Window

#: spec ``kind`` -> its Spark plan (a new kind adds its line here)
PLANS: dict[str, type[PartialPlan]] = {
    "tumbling": fixed_plan.FixedPlan,
    "hopping": fixed_plan.FixedPlan,
    "session": session_plan.SessionPlan,
    "sliding": sliding_plan.SlidingPlan,
}


def partial_plan(window: Window, aggregates: Callable[[Column], Aggregates], has_reason: bool) -> PartialPlan:
    """The window kind's plan for a run (see :class:`PartialPlan`)."""
    return PLANS[window.kind](window, aggregates, has_reason)


__all__ = ["PLANS", "PartialPlan", "WindowedFrames", "partial_plan"]
