"""Early triggers through the real pipeline into real targets (docs/contract/when-results-leave.md): what a reader
finds.

Tumbling 1-minute windows per ``user_id``, ``count`` as ``clicks``, ``emit_trigger = "every_batch"``,
lateness 0, one input file per micro-batch::

    batch 0: user 1 @ 5 s, user 2 @ 12 s      W = 12 s: window 0 open, both keys changed
    batch 1: user 1 @ 30 s, user 3 @ 65 s     W = 65 s: window 0 closes; window 60 s opens
    batch 2: user 3 @ 70 s, user 4 @ 80 s     W = 80 s: window 60 s stays open
    flush   (end_of_input = "flush")          window 60 s closes

The rows each batch writes follow from the contract alone (one non-retract row per changed or
closing (window, group); ``final`` when it closes, ``early`` when the trigger fires; with
``retractions`` a retract of the last written row before each superseding one). The test checks
the files, numbers and metrics against them and the reader's view against a plain count.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pyarrow as pa
from prometheus_client import CollectorRegistry
from psycopg import sql

from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import EmitTrigger, PipelineSpec, Target
from tests.dagster_support import small_spec
from tests.e2e.lateness_helpers import read_batch_dirs

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
S = 1_000_000
T0_US = int(T0.timestamp()) * S
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
FILES = [[(1, 5), (2, 12)], [(1, 30), (3, 65)], [(3, 70), (4, 80)]]
#: the target a reader ends with after the flush: (window start s, user) -> clicks, counted by hand
TRUTH = {(0, 1): 2, (0, 2): 1, (60, 3): 2, (60, 4): 1}
#: the kinds each write holds (batch 0, 1, 2, then the flush), from the contract
KINDS = [{"early": 2}, {"retract": 2, "final": 2, "early": 1}, {"retract": 1, "early": 2}, {"retract": 2, "final": 2}]


def early_spec(tmp_path: Path, target: Target, end_of_input: str) -> PipelineSpec:
    spec = small_spec(tmp_path, "early-clicks", target=target)
    return dataclasses.replace(spec, shape=dataclasses.replace(spec.window, emit_trigger=EmitTrigger("every_batch")),
                               run=dataclasses.replace(spec.run, end_of_input=end_of_input)).validate()


def run(spec: PipelineSpec, spark, batch_files) -> tuple[list, CollectorRegistry]:
    files = batch_files("in")
    for rows in FILES:
        files.write([{"user_id": u, "amount": 1.0, "ts": T0 + timedelta(seconds=s)} for u, s in rows], SCHEMA)
    registry = CollectorRegistry()
    summary = PipelineRunner(spec, spark=spark, metrics=StreamingMetrics(registry), progress=lambda line: None).run()
    return summary.reports, registry


def test_parquet_with_retractions_reads_back_as_the_truth(spark, tmp_path, batch_files):
    spec = early_spec(tmp_path, Target(kind="parquet", path=str(tmp_path / "out"), retractions=True), "flush")
    reports, registry = run(spec, spark, batch_files)
    assert [(r.counts.early_rows, r.counts.retractions) for r in reports] == [(k.get("early", 0), k.get("retract", 0)) for k in KINDS]

    got = read_batch_dirs(spec.target.path)  # each directory's part-0 rows, then its flush's
    assert sorted(got) == [0, 1, 2] and (Path(spec.target.path) / "batch_id=2" / "flush.parquet").exists()
    flushed = len(got[2]) - sum(KINDS[2].values())
    writes = [got[0], got[1], got[2][:-flushed], got[2][-flushed:]]
    assert [dict(Counter(r["_emit_kind"] for r in rows)) for rows in writes] == KINDS
    for rows in got.values():  # one sequence per directory: the flush continues batch 2's numbers
        assert [r["_emit_seq"] for r in rows] == list(range(len(rows)))
    for rows in writes:
        kinds = [r["_emit_kind"] for r in rows]
        assert kinds == sorted(kinds, key=lambda k: k != "retract"), "retracts come first in each write"

    def key(r: dict) -> tuple[int, int]:
        return ((r["window_start"] - T0_US) // S, r["user_id"])

    last: dict[tuple, dict] = {}  # the row a reader holds per key, written rows in (batch_id, _emit_seq) order
    signed: Counter[tuple] = Counter()
    for batch_id in sorted(got):
        for r in got[batch_id]:
            body = {c: v for c, v in r.items() if c != "_emit_seq"}
            if r["_emit_kind"] == "retract":
                assert body == {**last.pop(key(r)), "_emit_kind": "retract"}, "a retract repeats the row it withdraws"
                signed[key(r)] -= r["clicks"]
            else:
                last[key(r)] = body
                signed[key(r)] += r["clicks"]
    assert {k: (r["clicks"], r["_emit_kind"]) for k, r in last.items()} == {k: (n, "final") for k, n in TRUTH.items()}
    assert dict(signed) == TRUTH
    assert {key(r) for r in got[2][:-flushed] if r["_emit_kind"] == "early"} == {(60, 3), (60, 4)}, \
        "the flush writes the finals of keys the last batch wrote early"

    totals = sum((Counter(k) for k in KINDS), Counter())
    for emit_kind in ("early", "final", "correction", "retract"):
        value = registry.get_sample_value("ematix_streaming_rows_emitted_total",
                                          {"pipeline": "early-clicks", "emit_kind": emit_kind})
        assert value == totals[emit_kind], emit_kind


def test_postgres_keeps_emit_kind_and_the_latest_row_per_key(spark, tmp_path, batch_files, pg_dsn, pg_schema):
    table = f"{pg_schema}.early_clicks"
    spec = early_spec(tmp_path, Target(kind="postgres", url=pg_dsn, table=table, create_table=True), "keep")
    reports, _ = run(spec, spark, batch_files)
    assert [r.counts.early_rows for r in reports] == [2, 1, 2] and all(r.counts.retractions == 0 for r in reports)
    with psycopg.connect(pg_dsn) as conn:
        cur = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY window_start, user_id").format(
            sql.Identifier(pg_schema, "early_clicks")))
        names = [d.name for d in cur.description]
        rows = cur.fetchall()
    assert names == ["window_start", "window_end", "user_id", "clicks", "_emit_kind"]
    # window 0 closed (its early rows replaced by finals); window 60 s is still open: early rows
    assert [((ws - T0).seconds, u, n, kind) for ws, _, u, n, kind in rows] == [
        (0, 1, 2, "final"), (0, 2, 1, "final"), (60, 3, 2, "early"), (60, 4, 1, "early")]
