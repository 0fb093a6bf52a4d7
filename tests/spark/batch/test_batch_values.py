"""Two batches with different values (batch time, watermark) run the same generated code.

Spark writes a numeric literal into the Java code it generates, so a plan holding a batch's
watermark as a literal is new code every batch, compiled and JIT-compiled again
(``ematix_dagster/spark/batch/batch_values.py``). The batch's plan is built here for two batches of
each window kind, with and without ``[transform] sql``, and Spark's generated code for both is
compared as Spark's code cache compares it (without the comments, which name the plan's
expressions).
"""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomli_w
from pyspark.sql import DataFrame, SparkSession

from ematix_dagster.columns import CORRUPT
from ematix_dagster.spark.batch.batch_job import build_batch
from ematix_dagster.spark.batch.batch_shuffle import BatchShuffle
from ematix_dagster.spark.plans.window_plan import analyse
from ematix_dagster.spec import load_pipeline_str
from tests.pipeline_toml import windowed_pipeline_toml

US = 1_000_000
T0 = int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * US
WINDOWS = {
    "tumbling": {"window_kind": "tumbling", "duration_ms": 60_000},
    "hopping": {"window_kind": "hopping", "duration_ms": 60_000, "hop_ms": 20_000, "late_data": "reopen",
                "allowed_lateness_ms": 30_000},
    "session": {"window_kind": "session", "duration_ms": None, "gap_ms": 10_000, "max_session_duration_ms": 600_000,
                "late_data": "reopen", "allowed_lateness_ms": 30_000},
    "sliding": {"window_kind": "sliding", "duration_ms": 60_000, "max_events_per_group": 1_000},
}
#: (batch time, closed_before, emitted_before) of two batches; the first batch has no watermark yet
BATCHES = ((T0 + 7 * US, None, None), (T0 + 93 * US, T0 + 31 * US, T0 + 61 * US))


@pytest.fixture(scope="module")
def session(spark: SparkSession) -> SparkSession:
    """A session of its own (the batch's settings must not leak into other tests' session)."""
    own = spark.newSession()
    BatchShuffle().plan(own)  # as the engine runs a batch: the plan is then one final physical plan
    return own


def batch_input(session: SparkSession, root: Path) -> DataFrame:
    """A batch as the sources hand it over: the source's columns, ``_event_ts``, ``_source`` and
    the malformed-row column."""
    rows = pa.table({"id": [1, 2, 3], "k": ["a", "b", "a"], "v": [4, 5, 6], "page": ["p", "q", "p"],
                     "_event_ts": pa.array([T0, T0 + 20 * US, T0 + 70 * US], pa.timestamp("us", tz="UTC")),
                     "_source": ["events"] * 3, CORRUPT: pa.array([None] * 3, pa.string())})
    pq.write_table(rows, root / "batch.parquet")
    return session.read.parquet(str(root / "batch.parquet"))


def generated_code(session: SparkSession, frame: DataFrame) -> list[str]:
    """The Java source of each whole-stage subtree, without comments: what Spark's code cache keys on
    (comments name the plan's expressions, whose ids and generated aliases differ per plan)."""
    plan = frame._jdf.queryExecution().executedPlan()
    subtrees = session.sparkContext._jvm.org.apache.spark.sql.execution.debug.package.codegenStringSeq(plan)
    return [re.sub(r"/\*.*?\*/", "", subtrees.apply(i)._2(), flags=re.S) for i in range(subtrees.size())]


@pytest.mark.parametrize("sql", [False, True], ids=["no-sql", "sql"])
@pytest.mark.parametrize("kind", sorted(WINDOWS))
def test_two_batches_run_the_same_generated_code(session: SparkSession, tmp_path: Path, kind: str, sql: bool) -> None:
    toml = windowed_pipeline_toml("values", tmp_path, aggregations=[{"agg": "count", "as": "n"},
                                                                    {"agg": "sum", "column": "v", "as": "total"}],
                                  **WINDOWS[kind])
    if sql:
        doc = tomllib.loads(toml)
        doc["transform"]["sql"] = "SELECT *, v * 2 AS v2 FROM source WHERE page <> 'x'"
        toml = tomli_w.dumps(doc)
    spec = load_pipeline_str(toml)
    df = batch_input(session, tmp_path)
    plan = analyse(session, spec, df)
    codes = []
    for batch_id, (batch_time, closed_before, emitted_before) in enumerate(BATCHES):
        frames = build_batch(session, plan, df, batch_id, batch_time, closed_before, emitted_before)
        codes.append(generated_code(session, frames.partials))
        assert frames.partials.count() > 0  # the plan runs
    assert codes[0] and all("processNext" in code for code in codes[0])  # whole-stage code was generated
    for value in (v for batch in BATCHES for v in batch if v is not None):
        assert str(value) not in "".join(codes[0] + codes[1])
    assert codes[0] == codes[1]
