"""The Spark half of each window kind: one function per kind plans a batch's partials.

It assigns the rows of the SQL's output to their open windows, splits off the late ones and
pre-aggregates one partial per (window, group), by the rules of the kind's driver-side module
(``ematix_dagster.streaming.windows``).
"""

from __future__ import annotations

from ematix_dagster.spark.windows import fixed, session, sliding
from ematix_dagster.spark.windows.base import PartialPlan, WindowedFrames
from ematix_dagster.spec import Window

#: spec ``kind`` -> its Spark plan (a new kind adds its line here)
PLANS: dict[str, PartialPlan] = {
    "tumbling": fixed.plan_partials,
    "hopping": fixed.plan_partials,
    "session": session.plan_partials,
    "sliding": sliding.plan_partials,
}


def partial_plan(window: Window) -> PartialPlan:
    return PLANS[window.kind]


__all__ = ["PLANS", "PartialPlan", "WindowedFrames", "partial_plan"]
