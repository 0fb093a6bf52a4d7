"""Rows of every emit kind through the writers (docs/contract/emission.md): ``early`` and ``retract`` rows on real
parquet files read back with pyarrow, on the console, and in a real PostgreSQL, for a tumbling window's output schema
(no session id: deletes and ``_emit_seq`` hold for every kind, not only sessions).

The engine that writes early rows is tested elsewhere; here its output is built by hand, so each
test states the rows a batch holds and the target a reader must end up with.
"""

from __future__ import annotations

import datetime as dt

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spark.batch.convert import rows_to_arrow
from ematix_dagster.spec import Target
from ematix_dagster.streaming.emitted import Emitted, EmittedRow
from ematix_dagster.targets import make_window_writer
from tests.targets.writer_tables import PIPE, TS, batch, pg_target, select_df, table_rows, ts

SCHEMA = pa.schema([("window_start", TS), ("window_end", TS), ("user_id", pa.int64()), ("n", pa.int64()),
                    ("_emit_kind", pa.string()), ("_emit_seq", pa.int64())])
KEY = ["window_start", "user_id"]
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
M = 60_000_000  # one minute in µs: the window [0, M)


def emitted(*rows: tuple[str, int, int]) -> Emitted:
    """(kind, user_id, n) rows of the window [0, M)."""
    out = Emitted()
    out.add_rows([EmittedRow(0, M, (user,), (n,), kind) for kind, user, n in rows])
    return out


# ---------------------------------------------------------------------------------------------
# parquet and console


def test_parquet_early_rows_then_the_flush_continuing_the_batch_numbers(tmp_path):
    """every_batch with retractions: early rows, each superseding row preceded by a retract of the row
    it replaces; the end-of-input flush (finals) beside the last batch, numbered after its rows."""
    writer = make_window_writer(Target(kind="parquet", path=str(tmp_path)), PIPE, SCHEMA, KEY)
    writer.open()
    batches = [(0, "part-0", emitted(("early", 1, 2), ("early", 2, 1))),
               (1, "part-0", emitted(("retract", 1, 2), ("early", 1, 5))),
               (1, "flush", emitted(("retract", 1, 5), ("retract", 2, 1), ("final", 1, 5), ("final", 2, 1)))]
    first_seq = {"part-0": 0, "flush": 2}  # batch 1's part-0 wrote 2 rows
    for batch_id, part, rows in batches:
        writer.write(batch_id, rows_to_arrow(SCHEMA, rows, 1, first_seq=first_seq[part]), part)
    writer.close()

    read = {(b, part): pq.read_table(tmp_path / f"batch_id={b}" / f"{part}.parquet") for b, part, _ in batches}
    assert all(t.schema == SCHEMA for t in read.values())
    assert [(r["_emit_kind"], r["user_id"], r["n"], r["_emit_seq"]) for r in read[(1, "flush")].to_pylist()] == [
        ("retract", 1, 5, 2), ("retract", 2, 1, 3), ("final", 1, 5, 4), ("final", 2, 1, 5)]
    assert read[(1, "part-0")].column("_emit_seq").to_pylist() == [0, 1]
    assert read[(0, "part-0")].column("window_end").to_pylist() == [EPOCH + dt.timedelta(minutes=1)] * 2

    rows = [(b, r) for (b, _), t in read.items() for r in t.to_pylist()]
    latest: dict[int, tuple[tuple[int, int], dict]] = {}
    for b, r in rows:  # the reader's rule: the largest (batch_id, _emit_seq) per key, retracted keys dropped
        if r["user_id"] not in latest or (b, r["_emit_seq"]) > latest[r["user_id"]][0]:
            latest[r["user_id"]] = ((b, r["_emit_seq"]), r)
    assert {u: (r["_emit_kind"], r["n"]) for u, (_, r) in latest.items()} == {1: ("final", 5), 2: ("final", 1)}
    signed: dict[int, int] = {}  # with retractions, +1 per row and -1 per retract gives the current values
    for _, r in rows:
        signed[r["user_id"]] = signed.get(r["user_id"], 0) + (-r["n"] if r["_emit_kind"] == "retract" else r["n"])
    assert signed == {1: 5, 2: 1}


def test_console_prints_emit_kind_and_emit_seq(capsys):
    writer = make_window_writer(Target(kind="console"), PIPE, SCHEMA, KEY)
    writer.open()
    writer.write(2, rows_to_arrow(SCHEMA, emitted(("retract", 7, 1), ("early", 7, 3)), 1))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "-- batch 2: 2 windows --"
    assert lines[1].split() == ["window_start", "window_end", "user_id", "n", "_emit_kind", "_emit_seq"]
    assert lines[2].split()[-4:] == ["7", "1", "retract", "0"] and lines[3].split()[-4:] == ["7", "3", "early", "1"]


# ---------------------------------------------------------------------------------------------
# postgres


def open_pg(target: Target, store_emit_kind: bool):
    writer = make_window_writer(target, PIPE, SCHEMA, KEY, store_emit_kind=store_emit_kind)
    writer.open()
    return writer


def pg_batch(*rows: tuple[int, int | None, int, str]) -> pa.Table:
    """(window start minute, user_id, n, kind) rows, numbered in order."""
    return batch(SCHEMA, [(ts(m), ts(m + 1), user, n, kind, i) for i, (m, user, n, kind) in enumerate(rows)])


def test_postgres_stores_emit_kind_for_an_early_trigger_and_deletes_retracts_first(dsn, schema):
    writer = open_pg(pg_target(dsn, f"{schema}.early"), store_emit_kind=True)
    cols = select_df(dsn, sql.SQL("SELECT column_name, data_type FROM information_schema.columns "
                                  "WHERE table_schema = %s AND table_name = 'early' ORDER BY ordinal_position"),
                     (schema,))
    assert list(zip(cols.column_name, cols.data_type))[-2:] == [("n", "bigint"), ("_emit_kind", "text")]
    assert "_emit_seq" not in set(cols.column_name)

    def target() -> list[tuple]:
        return [(s.minute, u, n, k) for s, _, u, n, k in table_rows(dsn, schema, "early", "window_start, user_id")]

    writer.write(0, pg_batch((0, 1, 2, "early"), (0, 2, 1, "early"), (0, None, 3, "early")))
    assert target() == [(0, 1, 2, "early"), (0, 2, 1, "early"), (0, None, 3, "early")]
    # (0, 2) disappears; (0, 1) closes with the values of its early row: only the kind changes;
    # (0, NULL) is retracted and written again in the same batch: the delete runs before the upsert
    later = pg_batch((0, 2, 1, "retract"), (0, None, 3, "retract"), (0, 1, 2, "final"), (0, None, 4, "final"),
                     (1, 1, 1, "early"))
    for _ in range(2):  # a replay leaves what one write left
        writer.write(1, later)
        assert target() == [(0, 1, 2, "final"), (0, None, 4, "final"), (1, 1, 1, "early")]
    writer.write(2, pg_batch((1, 1, 3, "correction")))
    assert target()[-1] == (1, 1, 3, "correction")
    writer.close()


def test_postgres_without_an_early_trigger_keeps_the_seed_columns(dsn, schema):
    writer = open_pg(pg_target(dsn, f"{schema}.plain"), store_emit_kind=False)
    writer.write(0, pg_batch((0, 1, 2, "final"), (0, 2, 1, "final")))
    writer.write(1, pg_batch((0, 2, 1, "retract"), (0, 1, 4, "correction")))
    writer.close()
    assert [(u, n) for _, _, u, n in table_rows(dsn, schema, "plain", "user_id")] == [(1, 4)]


@pytest.mark.parametrize("create", [False, True], ids=["existing", "create_table-on-existing"])
def test_postgres_table_without_emit_kind_is_refused_for_an_early_trigger(dsn, schema, create):
    """A table made for the watermark trigger lacks ``_emit_kind``: an early trigger refuses it at
    start (``CREATE TABLE IF NOT EXISTS`` leaves an existing table as it is) instead of hiding which
    rows are early."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (window_start timestamptz, window_end timestamptz, user_id bigint, "
                             "n bigint, UNIQUE NULLS NOT DISTINCT (window_start, user_id))")
                     .format(sql.Identifier(schema, "old")))
    with pytest.raises(PipelineConfigError, match="lacks column.*_emit_kind") as info:
        open_pg(pg_target(dsn, f"{schema}.old", create=create), store_emit_kind=True)
    assert info.value.key == "target.table"
    open_pg(pg_target(dsn, f"{schema}.old", create=create), store_emit_kind=False).close()  # fine for watermark
