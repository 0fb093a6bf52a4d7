"""SQL analysis at start, on real Spark: a transform's SQL that loses a required column, and sources whose
same-named columns clash, are refused before the first batch, naming the key."""

from __future__ import annotations

import pytest

from ematix_dagster.errors import PipelineConfigError
from tests.e2e.lateness_helpers import files_source, make_spec, run

# -- 9: SQL analysis at start -------------------------------------------------------------------------

BAD_SQL = [
    ("SELECT id, k, v, _source FROM source", "transform.sql", "_event_ts"),
    ("SELECT id, k, v, _event_ts FROM source", "transform.sql", "_source"),
    ("SELECT k, max(v) AS v, max(_event_ts) AS _event_ts, max(_source) AS _source FROM source GROUP BY k",
     "transform.sql", "row-wise"),
    ("SELECT id, k, sum(v) OVER (PARTITION BY k) AS v, _event_ts, _source FROM source", "transform.sql", "row-wise"),
    ("SELECT id, k, v, _event_ts, _source FROM source ORDER BY v", "transform.sql", "row-wise"),
    ("SELECT id, k, v, _event_ts, _source FROM source LIMIT 5", "transform.sql", "row-wise"),
    ("SELECT DISTINCT id, k, v, _event_ts, _source FROM source", "transform.sql", "row-wise"),
    ("SELECT id, k, no_such_column AS v, _event_ts, _source FROM source", "transform.sql", "no_such_column"),
    ("SELECT id, v, _event_ts, _source FROM source", "transform.window.group_by[0]", "'k'"),
    ("SELECT id, k, CAST(v AS STRING) AS v, _event_ts, _source FROM source",
     "transform.window.aggregations[0].column", "sum"),
]


@pytest.mark.parametrize("sql,key,words", BAD_SQL, ids=[
    "no-event-ts", "no-source", "group-by", "window-function", "order-by", "limit", "distinct", "unknown-column",
    "group-by-column-missing", "sum-over-string"])
def test_sql_analysis_errors_at_start(spark, tmp_path, sql, key, words):
    (tmp_path / "empty").mkdir()
    spec = make_spec(tmp_path, "bad-sql", [files_source("a", tmp_path / "empty")], {
        "kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"],
        "aggregations": [{"agg": "sum", "column": "v", "as": "v_sum"}],
    }, sql=sql)
    with pytest.raises(PipelineConfigError) as err:
        run(spec, spark)
    assert err.value.key == key
    assert str(err.value).startswith(key + ":") and words in str(err.value)
    assert not (tmp_path / "bad-sql-cp" / "offsets").exists(), "nothing ran"


def test_sources_whose_same_named_columns_clash_are_refused_at_start(spark, tmp_path):
    """A STRING column meeting a TIMESTAMP one of the same name would be cast (ANSI) in the union
    and fail the first batch holding a bad value ('not a time'): refused before anything runs."""
    (tmp_path / "j").mkdir()
    (tmp_path / "p").mkdir()
    spec = make_spec(tmp_path, "clash", [
        files_source("j", tmp_path / "j", "json", "id BIGINT, k STRING, v BIGINT, ts STRING"),
        files_source("p", tmp_path / "p"),
    ], {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"], "aggregations": [{"agg": "count", "as": "n"}]})
    with pytest.raises(PipelineConfigError) as err:
        run(spec, spark)
    assert err.value.key == "sources[1]" and "'ts'" in str(err.value)
