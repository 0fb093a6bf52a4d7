"""A micro-batch's Spark job, planned: classify rows, apply the SQL, assign windows, pre-aggregate.

Given the batch's union of sources, this builds (lazily) three things that run as one Spark job:

* per-source statistics measured *before* the SQL (rows, max valid event time, invalid /
  future / malformed counts), collected with ``DataFrame.observe`` so no extra pass is needed;
* the SQL's output with each row's open window assignments, and lateness counters;
* one partial aggregate per (window, group key).

The last two follow the window kind's rules: its plan in ``ematix_dagster.spark.plans.windows``. The
job's result is read back by ``ematix_dagster.spark.batch.batch_counts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Callable, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from ematix_dagster.columns import BATCH_ID, BATCH_VALUES, CORRUPT, EVENT_TS, REASON, TS
from ematix_dagster.spark.batch.batch_values import with_batch_values
from ematix_dagster.spark.batch.observed import Observed
from ematix_dagster.spark.plans.window_plan import BatchPlan, apply_sql
from ematix_dagster.spark.sources.readers import source_rows
from ematix_dagster.streaming.micro_batch import SourceStats


@dataclass
class BatchFrames:
    """The lazily built frames of one batch (``ematix_dagster.spark.plans.windows.kind_plan``: one job)."""

    partials: DataFrame  # partials, class rows and hidden counters: read with ``spark.batch.batch_counts``
    source_stats: Observed | None  # with [transform] sql: pre-SQL counts, observed as the job runs
    # built only when dead letters are written (every DataFrame step is analysed at once)
    bad_rows: Callable[[], DataFrame]  # pre-SQL rows with an invalid / future / malformed event time
    class_rows: Callable[[Sequence[str]], DataFrame]  # post-SQL rows of some classes (late, rejected)
    classified: Callable[[], DataFrame]  # post-SQL rows with their CLASS (``WindowedFrames.classified``)

    def dead_letter_table(self, sources: dict[str, SourceStats], late_rows: int, rejected: dict[str, int],
                          late_to_dlq: bool) -> pa.Table | None:
        """The batch's dead-letter rows (``_reason`` set) given its counters, None when it has none:
        the pre-SQL rows with a bad event time, then the post-SQL classes (late under ``dlq``, the
        rejected ones) in one frame, so that each kind costs one Spark job and only when counted."""
        tables: list[pa.Table] = []
        if any(s.invalid or s.future or s.malformed for s in sources.values()):
            tables.append(self.bad_rows().toArrow())
        classes = [*(["late"] if late_rows and late_to_dlq else []), *rejected]
        if classes:
            tables.append(self.class_rows(classes).toArrow())
        if not tables:
            return None
        return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def build_batch(spark: SparkSession, plan: BatchPlan, df: DataFrame, batch_id: int, batch_time_us: int,
                closed_before: int | None, emitted_before: int | None, late_on_driver: bool = False) -> BatchFrames:
    """The batch's single Spark job, planned.

    Without ``[transform] sql`` the rows with a bad event time ride along into the aggregation as
    class rows, so every counter comes out of the partials' own job. A SQL may filter rows, and
    the source counters are taken before it (docs/contract/time-and-watermarks.md), so with a SQL they are observed on the
    SQL's input instead. The batch's values are columns (``ematix_dagster.spark.batch.batch_values``),
    so the plan's generated code is the same every batch, and its columns are the run's
    (``ematix_dagster.spark.batch.batch_columns.BatchColumns``): a batch only applies them to its rows.
    """
    spec = plan.spec
    values = (batch_time_us, closed_before, emitted_before)
    if late_on_driver:  # no batch values: the dead-letter frames, built only when asked, are the exact plan's
        fast = plan.late_on_driver
        assert fast is not None
        partials = fast.partials(source_rows(spec, df))

        @cache  # bad rows and class rows of one batch from one exact plan
        def exact() -> BatchFrames:
            return build_batch(spark, plan, df, batch_id, *values)

        return BatchFrames(partials, None, lambda: exact().bad_rows(), lambda classes: exact().class_rows(classes),
                           lambda: exact().classified())
    columns = plan.columns  # built at the first batch that needs the exact plan (most runs of a late_on_driver plan: none)
    df = with_batch_values(source_rows(spec, df), *values)
    if spec.window.time_mode == "processing":
        df = df.withColumn(EVENT_TS, columns.processing_time)

    def classified() -> DataFrame:
        return df.select("*", *columns.classified)

    def bad_rows() -> DataFrame:
        return (classified().filter(F.col(REASON).isNotNull()).drop(TS, *BATCH_VALUES)
                .withColumn(BATCH_ID, F.lit(batch_id).cast("bigint")))

    source_stats: Observed | None = None
    if spec.transform_sql:
        rows = classified()
        source_stats = Observed(Observation(f"sources_{batch_id}"), rows, columns.source_stats)
        valid = rows.observe(source_stats.observation, *columns.source_stats).filter(columns.valid)
        sql_input = valid.drop(TS, REASON, CORRUPT, *BATCH_VALUES)
        out = with_batch_values(apply_sql(spark, spec, sql_input, plan.sql_columns), *values)
        if columns.reason is not None:
            out = out.withColumn(REASON, columns.reason)
    else:  # one step: each row's reason beside its columns (the window plan adds ``_ts``)
        assert columns.reason is not None
        out = df.select("*", columns.reason.alias(REASON))
    windowed = columns.windows.frames(out, batch_id)
    return BatchFrames(windowed.partials, source_stats, bad_rows, windowed.class_rows, lambda: windowed.classified)
