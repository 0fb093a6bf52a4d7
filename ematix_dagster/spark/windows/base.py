"""What a window kind's Spark plan hands back to the batch (see ``ematix_dagster.spark.windows``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql import Column, DataFrame

from ematix_dagster.spark.observed import Observed
from ematix_dagster.spec import Window


@dataclass
class WindowedFrames:
    """The lazily built frames of a batch's window assignment.

    ``partials`` has one row per (``_ws`` window start, group columns) with the aggregators'
    partial columns; ``late_stats`` observes ``late_rows``, ``late_assignments`` and
    ``reopened_rows`` (BatchInput's counters) while the partials are computed. ``late_rows``
    builds its frame only when asked (``dlq`` with late rows): every DataFrame step is analysed
    by Spark at once, and a batch pays for that even when the frame never runs.
    """

    partials: DataFrame
    late_rows: Callable[[], DataFrame]  # post-SQL rows with no open window, with _batch_id and _reason
    late_stats: Observed


#: (the SQL's output, the window spec, the partial aggregate columns, batch id, closed_before,
#: emitted_before) -> the frames; ``closed_before`` / ``emitted_before`` as ``Engine`` gives them
PartialPlan = Callable[[DataFrame, Window, list[Column], int, int | None, int | None], WindowedFrames]
