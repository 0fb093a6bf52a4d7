"""Every SQL text the engine makes of the example pipelines is the committed one, byte for byte.

The texts are what Spark runs or analyses: a windowed pipeline's ``[transform] sql`` as written and
guarded (``spark.plans.window_plan.apply_sql``); a row pipeline's release plan, its row query and that query
guarded (``spark.plans.row_plan``, ``spark.batch.row_call.RowPlan``); an ``[emit] sql``'s release plan and the
guarded release query over the pipeline's own view (``spark.batch.emit_stage.EmitStage``); a
``[backfill]``'s SQL restricted to its first partition (``backfill.compute.derived_spec``), guarded.
:func:`sql_texts` recomputes them through the package's functions, without Spark, and
``tests/fixtures/golden_sql/<file stem>.json`` holds what they were (``make_snapshots.py`` wrote
them): a change of the engine that is meant to keep its behaviour must keep these texts, and an
example pipeline added to ``pipelines/`` needs its snapshot. The Python twins in
``pipelines/examples.py`` must give the same texts as their TOML files. Two specs beyond the examples
(``EDGE_PIPELINES``, snapshots in ``more/``) reach the rewrites the examples do not. One test has the
engine's own objects build the row and release queries on the shared SparkSession, so that the
construction :func:`sql_texts` repeats cannot drift from the engine's.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from sqlglot import exp

from ematix_dagster.backfill.compute import derived_spec
from ematix_dagster.backfill.range import BackfillRange
from ematix_dagster.columns import EVENT_TS, SOURCE
from ematix_dagster.spark.batch.convert import output_schema
from ematix_dagster.spark.batch.emit_stage import EmitStage
from ematix_dagster.spark.batch.row_call import RowPlan
from ematix_dagster.spark.plans.safe_sql import GuardedSql, SourceRow, guard_sql
from ematix_dagster.spark.plans.window_plan import VIEW, analyse, guarded_sql, source_row
from ematix_dagster.spec import PipelineSpec, load_pipeline, load_pipeline_str
from ematix_dagster.spec.emit import predicate_columns
from ematix_dagster.sql.emit_query import KEY, emit_plan
from ematix_dagster.sql.parsing import parse_statement, text
from ematix_dagster.sql.release_plan import ReleasePlan, release_plan
from ematix_dagster.sql.row_query import row_query
from pipelines.examples import PIPELINES  # sets EMATIX_PG_URL's default: clicks-per-minute's target names it

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "pipelines"
SNAPSHOTS = ROOT / "tests" / "fixtures" / "golden_sql"
#: the derived backfill spec's scratch directory: it names no SQL, only files
SCRATCH = Path("backfill-scratch")


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.toml"))


def _plan(plan: ReleasePlan | None) -> dict[str, Any]:
    """A release plan's query and OR branches (their guard and bound as SQL text)."""
    if plan is None:
        return {"sql": None, "branches": None}
    return {"sql": plan.sql, "branches": [asdict(b) for b in plan.branches]}


def _guarded(prefix: str, guarded: GuardedSql) -> dict[str, Any]:
    return {f"{prefix}.sql": guarded.sql, f"{prefix}.expressions": list(guarded.expressions)}


def _windowed(spec: PipelineSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if spec.transform_sql:  # the batches run the guarded form; the written one is analysed at start
        out.update(_guarded("windowed.guarded", guarded_sql(spec.transform_sql, source_row(spec))))
    if spec.emit is not None:
        columns = predicate_columns(spec.window)
        plan = emit_plan(spec.emit.sql, columns)
        read = _plan(plan)
        # EmitStage.analysed: the plan's query over the pipeline's own view (windows renamed), guarded
        view = f"_emit_windows_{spec.pipeline_name.replace('-', '_')}"
        tree = parse_statement(plan.sql, KEY)
        for table in tree.find_all(exp.Table):
            table.set("this", exp.to_identifier(view))
        out.update({"emit.sql": spec.emit.sql, "emit.predicate_columns": list(columns),
                    "emit.release_plan.sql": read["sql"], "emit.release_plan.branches": read["branches"],
                    "emit.view": view, **_guarded("emit.release_query", guard_sql(text(tree)))})
    if spec.backfill is not None:  # its first partition
        rng = BackfillRange(spec.backfill.start_us, spec.backfill.start_us + spec.backfill.partition_us)
        derived = derived_spec(spec, rng, SCRATCH)
        assert derived.transform_sql is not None  # restricted_to always gives a query
        out.update({"backfill.range": str(rng), "backfill.restricted.sql": derived.transform_sql,
                    **_guarded("backfill.guarded", guarded_sql(derived.transform_sql, source_row(derived)))})
    return out


def _rows(spec: PipelineSpec) -> dict[str, Any]:
    assert spec.transform_sql is not None  # a row pipeline has one
    plan = _plan(release_plan(spec.transform_sql))  # analysed at start (its row-wise check)
    query, _ = row_query(spec.transform_sql)  # analysed at start, then guarded for the batches
    return {"rows.release_plan.sql": plan["sql"], "rows.release_plan.branches": plan["branches"],
            "rows.query.sql": query, **_guarded("rows.guarded", guard_sql(query, SourceRow(VIEW)))}


def sql_texts(spec: PipelineSpec) -> dict[str, Any]:
    """Which SQL -> its text (a list of texts, or a plan's branches), for one pipeline."""
    kind = "rows" if spec.is_row_pipeline else "windowed"
    return {"pipeline": spec.pipeline_name, "kind": kind, "transform.sql": spec.transform_sql,
            **(_rows(spec) if spec.is_row_pipeline else _windowed(spec))}


def render(texts: dict[str, Any]) -> str:
    """The snapshot file's text."""
    return json.dumps(texts, indent=2, ensure_ascii=False) + "\n"


# -- specs beyond the examples --------------------------------------------------------------------------------
# The examples reach few of the rewrites: no strict bound, no guarded [emit] branch, no cast in a windowed
# SQL, no _source_row there. These two do (the row SQL is tests/e2e/row_helpers.py's DELAYED_SQL); their texts
# are in tests/fixtures/golden_sql/more/. Paths and URLs are never read: nothing runs.

_SOURCE = {"name": "a", "kind": "files", "format": "parquet", "path": "in", "event_time_column": "ts",
           "schema": "id BIGINT, k STRING, v BIGINT, page STRING, ts TIMESTAMP"}
EDGE_PIPELINES: dict[str, dict[str, Any]] = {
    "rows_delayed": {
        "pipeline_name": "golden-rows-delayed",
        "sources": [_SOURCE],
        "transform": {"sql": """SELECT id, k, v, page, _event_ts FROM source
WHERE (k = 'emb' AND _event_ts + INTERVAL 2 MINUTES <= WATERMARK_TS())
   OR (k = 'strict' AND WATERMARK_TS() > _event_ts + INTERVAL 1 MINUTE)
   OR (v >= 100 AND CAST(page AS TIMESTAMP) < WATERMARK_TS())
   OR k = 'rt'""", "lateness_ms": 30_000, "max_buffered_rows": 100},
        "target": {"kind": "parquet", "path": "out"},
        "dead_letter": {"kind": "parquet", "path": "dlq"},
        "state_store": {"kind": "sqlite", "path": "state.db"},
        "run": {"checkpoint_location": "cp"},
    },
    "windowed_guarded": {
        "pipeline_name": "golden-windowed-guarded",
        "sources": [_SOURCE],
        "transform": {
            "sql": "SELECT id, k, CAST(v AS INT) AS v, v / (id - 2) AS ratio, TO_TIMESTAMP(page) AS seen, _event_ts, "
                   "_source FROM source WHERE CAST(page AS INT) > 0 OR k = 'x'",
            "window": {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["k"], "max_groups_per_window": 100,
                       "aggregations": [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}]}},
        "target": {"kind": "postgres", "url": "postgresql://golden@127.0.0.1:5432/test", "table": "public.golden"},
        "dead_letter": {"kind": "parquet", "path": "dlq", "include_source_row": "all"},
        "state_store": {"kind": "sqlite", "path": "state.db"},
        "run": {"checkpoint_location": "cp"},
        "emit": {"sql": "SELECT * FROM windows WHERE (k = 'b' AND window_start < WATERMARK_TS()) "
                        "OR (k <> 'b' AND window_end + INTERVAL 30 SECONDS <= WATERMARK_TS())",
                 "max_buffered_rows": 100},
        "backfill": {"partition": "daily", "start": "2024-01-01"},
    },
}
MORE = SNAPSHOTS / "more"


def snapshots() -> dict[str, tuple[PipelineSpec, Path]]:
    """name -> (spec, its snapshot file): every example TOML, then the specs above."""
    out = {p.stem: (load_pipeline(p), SNAPSHOTS / f"{p.stem}.json") for p in example_files()}
    for name, doc in EDGE_PIPELINES.items():
        out[f"more/{name}"] = (load_pipeline_str(tomli_w.dumps(doc)), MORE / f"{name}.json")
    return out


def test_every_example_pipeline_has_a_snapshot():
    assert {p.stem for p in example_files()} == {p.stem for p in SNAPSHOTS.glob("*.json")}
    assert set(EDGE_PIPELINES) == {p.stem for p in MORE.glob("*.json")}


@pytest.mark.parametrize("name", list(snapshots()))
def test_the_sql_texts_are_the_committed_ones(name: str):
    spec, path = snapshots()[name]
    committed = path.read_text()
    texts = sql_texts(spec)
    stored = json.loads(committed)
    for key in stored.keys() | texts.keys():
        assert texts.get(key, "<missing>") == stored.get(key, "<missing>"), key
    assert render(texts) == committed


def test_the_python_examples_give_the_texts_of_their_toml_files():
    by_name = {json.loads(p.read_text())["pipeline"]: p for p in SNAPSHOTS.glob("*.json")}
    assert set(PIPELINES) <= set(by_name)
    for name, pipeline in PIPELINES.items():
        assert render(sql_texts(pipeline.spec)) == by_name[name].read_text(), name


def test_the_engine_builds_the_same_texts(spark):
    """The row query and the ``[emit]`` release query are built above as the engine builds them; here the
    engine's own objects (``RowPlan``, ``EmitStage``) build them, Spark analysing each over an empty frame of
    the stream's columns, and they must be the committed texts. (After a refactor, build them through what
    replaced those objects.)"""
    built = 0
    for name, (spec, path) in snapshots().items():
        if not spec.is_row_pipeline and spec.emit is None:
            continue
        stored = json.loads(path.read_text())
        stream = spark.createDataFrame([], f"{spec.sources[0].schema}, {EVENT_TS} TIMESTAMP, {SOURCE} STRING")
        if spec.is_row_pipeline:
            assert RowPlan.build(spark, spec, stream).sql == stored["rows.guarded.sql"], name
        else:
            stage = EmitStage.analysed(spec, output_schema(analyse(spark, spec, stream)))
            assert (stage.sql, stage.view) == (stored["emit.release_query.sql"], stored["emit.view"]), name
        built += 1
    assert built >= 4


def test_the_snapshots_hold_every_kind_of_text():
    """What the snapshots hold (so that a lost spec or key cannot empty the comparison)."""
    snapshots = [json.loads(p.read_text()) for p in (*SNAPSHOTS.glob("*.json"), *MORE.glob("*.json"))]
    keys = set().union(*snapshots)
    assert {"windowed.guarded.sql", "rows.release_plan.sql", "rows.query.sql", "rows.guarded.sql",
            "emit.release_plan.sql", "emit.release_query.sql", "backfill.restricted.sql",
            "backfill.guarded.sql"} <= keys
    branches = [b for s in snapshots for b in (s.get("rows.release_plan.branches") or [])
                + (s.get("emit.release_plan.branches") or [])]
    assert any(b["strict"] for b in branches) and any(b["guard"] and b["release_at"] for b in branches)
    assert any(s.get("windowed.guarded.expressions") for s in snapshots)
    assert any("_source_row" in (s.get("windowed.guarded.sql") or "") for s in snapshots)
