"""Dead-letter writers against a real PostgreSQL and real parquet files (no mocks)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import DeadLetter
from ematix_dagster.targets import DeadLetterWriter, make_dead_letter_writer
from tests.targets.writer_tables import PIPE, TS, select_df, ts

# ---------------------------------------------------------------------------------------------
# dead letters


def dead_rows(batch_id: int, n: int, offset: int = 0) -> pa.Table:
    ids = list(range(offset, offset + n))
    return pa.table({
        "user_id": pa.array(ids, pa.int64()),
        "amount": pa.array([Decimal("1.50") if i % 2 == 0 else None for i in ids], pa.decimal128(8, 2)),
        "page": pa.array([f"p{i}\x00" for i in ids], pa.string()),
        "seen": pa.array([dt.datetime(2024, 5, 1, 12, 0, i) for i in ids], pa.timestamp("us", tz="UTC")),
        "raw": pa.array([bytes([i, 255]) for i in ids], pa.binary()),
        "score": pa.array([float("nan") if i == offset else i / 2 for i in ids], pa.float64()),
        "tags": pa.array([["a", "b"] for _ in ids], pa.list_(pa.string())),
        "_source": pa.array(["clicks"] * n),
        "_event_ts": pa.array([ts(0, i) if i != offset else None for i in ids], TS),
        "_batch_id": pa.array([batch_id] * n, pa.int64()),
        "_reason": pa.array(["late" if i % 2 else "invalid_event_time" for i in ids]),
    })


def expected_payload(i: int, offset: int) -> dict:
    return {
        "user_id": i,
        "amount": "1.50" if i % 2 == 0 else None,
        "page": f"p{i}\ufffd",
        "seen": f"2024-05-01T12:00:{i:02d}+00:00",
        "raw": base64.b64encode(bytes([i, 255])).decode(),
        "score": "NaN" if i == offset else i / 2,
        "tags": ["a", "b"],
    }


def read_dlq(dsn: str, schema: str, table: str = "dlq") -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql.SQL(
            "SELECT _batch_id, _source, _event_ts, _reason, payload FROM {} ORDER BY _batch_id, (payload->>'user_id')::int"
        ).format(sql.Identifier(schema, table))).fetchall()


def test_postgres_dead_letters_payload_and_replay(dsn, schema):
    dl = make_dead_letter_writer(DeadLetter(kind="postgres", url=dsn, table=f"{schema}.dlq", create_table=True), PIPE)
    assert isinstance(dl, DeadLetterWriter) and dl.idempotent
    dl.open()
    dl.write(3, dead_rows(3, 3))
    dl.write(4, dead_rows(4, 1, offset=10))
    dl.write(3, dead_rows(3, 2))  # replay of batch 3 with fewer rows: replaced, batch 4 untouched
    dl.write(5, pa.table({"_source": pa.array([], pa.string()), "_reason": pa.array([], pa.string())}))
    dl.close()

    cols = select_df(dsn, sql.SQL("SELECT column_name, data_type FROM information_schema.columns "
                                  "WHERE table_schema = %s AND table_name = 'dlq' ORDER BY ordinal_position"), (schema,))
    assert dict(zip(cols.column_name, cols.data_type)) == {
        "_batch_id": "bigint", "_source": "text", "_event_ts": "timestamp with time zone", "_reason": "text",
        "payload": "jsonb"}

    got = read_dlq(dsn, schema)
    expected = [
        (3, "clicks", None, "invalid_event_time", expected_payload(0, 0)),
        (3, "clicks", ts(0, 1), "late", expected_payload(1, 0)),
        (4, "clicks", None, "invalid_event_time", expected_payload(10, 10)),
    ]
    assert got == expected


def test_postgres_dead_letters_schema_drift_and_transaction(dsn, schema):
    dl = make_dead_letter_writer(DeadLetter(kind="postgres", url=dsn, table=f"{schema}.dlq", create_table=True), PIPE)
    dl.open()
    dl.write(0, pa.table({"a": [1], "_source": ["s1"], "_event_ts": pa.array([ts(0)], TS), "_reason": ["future"]}))
    # Another payload shape, no _event_ts at all (malformed rows), and a caller-owned transaction.
    drifted = pa.table({"b": ["x"], "nested": [{"k": 1.5}], "_source": ["s2"], "_reason": ["malformed"]})
    with psycopg.connect(dsn) as conn:
        dl.write_in_transaction(conn, 1, drifted)
        conn.rollback()
        dl.write_in_transaction(conn, 1, drifted)
        conn.commit()
    dl.close()
    with psycopg.connect(dsn) as conn:
        got = conn.execute(sql.SQL("SELECT _batch_id, _source, _event_ts, _reason, payload FROM {} ORDER BY 1")
                           .format(sql.Identifier(schema, "dlq"))).fetchall()
    assert got == [(0, "s1", ts(0), "future", {"a": 1}),
                   (1, "s2", None, "malformed", {"b": "x", "nested": {"k": 1.5}})]


def test_postgres_dead_letter_table_must_exist_without_create_table(dsn, schema):
    dl = make_dead_letter_writer(DeadLetter(kind="postgres", url=dsn, table=f"{schema}.dlq"), PIPE)
    with pytest.raises(PipelineConfigError, match="does not exist"):
        dl.open()
    dl.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (_batch_id bigint, _source text, _reason text)")
                     .format(sql.Identifier(schema, "dlq")))
    with pytest.raises(PipelineConfigError, match="_event_ts, payload"):
        dl.open()
    dl.close()


def test_parquet_dead_letters(tmp_path):
    root = tmp_path / "dlq"
    dl = make_dead_letter_writer(DeadLetter(kind="parquet", path=str(root)), PIPE)
    assert dl.idempotent
    dl.open()
    dl.write(3, dead_rows(3, 3))
    dl.write(4, pa.table({"other": ["x"], "_source": ["s"], "_event_ts": pa.array([None], TS),
                          "_batch_id": pa.array([4], pa.int64()), "_reason": ["malformed"]}))
    dl.write(3, dead_rows(3, 2))  # replay: replaced
    dl.write(9, dead_rows(9, 0))  # empty: nothing
    dl.close()
    assert sorted(p.name for p in root.iterdir()) == ["batch_id=3", "batch_id=4"]
    b3 = pq.read_table(root / "batch_id=3" / "part-0.parquet")
    assert b3.schema == dead_rows(3, 2).schema
    assert b3.column("user_id").to_pylist() == [0, 1]
    assert b3.column("_reason").to_pylist() == ["invalid_event_time", "late"]
    b4 = pq.read_table(root / "batch_id=4" / "part-0.parquet").to_pylist()
    assert b4 == [{"other": "x", "_source": "s", "_event_ts": None, "_batch_id": 4, "_reason": "malformed"}]


def test_json_payload_is_valid_json():
    # The payload of every row is JSON PostgreSQL accepts (no NaN literals, no NUL escapes).
    from ematix_dagster.targets.pg_types import _json_value

    payload = {c: _json_value(v) for c, v in dead_rows(0, 1).slice(0, 1).to_pylist()[0].items()}
    text = json.dumps(payload, allow_nan=False)
    assert "\\u0000" not in text
