"""A real pipeline's state in the real store (SQLite and PostgreSQL; its groups as the state rows of a store of
schema 7, ``tests/state_store/legacy_rows.py``), for the corrupt-input tests
(tests/e2e/test_corrupt_state.py, test_corrupt_checkpoint.py): ``Setup`` and the ``setup`` fixture (one per
store kind), the valid state it writes, and the checks of an error's message.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from datasketches import hll_sketch
from psycopg import sql

from ematix_dagster.errors import EmatixError
from ematix_dagster.fingerprint import fingerprint, fingerprint_doc
from ematix_dagster.spec import PipelineSpec, load_pipeline_str
from ematix_dagster.stores import make_store
from ematix_dagster.streaming.durable import restore_engine
from ematix_dagster.streaming.micro_batch import Engine
from state_store import migrations
from state_store.codec import STATE_VERSION, encode_key, encode_state
from state_store.contract import BatchCommit, PipelineRecord, SourceProgress, StateStore
from tests.pipeline_toml import postgres_store, sqlite_store, windowed_pipeline_toml
from tests.state_store.legacy_rows import write_rows

S = 1_000_000
PIPELINE = "corrupt-inputs"
QUERY_ID = "0b6a2c0e-5d1f-4f4e-9d7a-7a0c1e2f3a4b"
OFFSET = '{"logOffset":0}'
KINDS = ["sqlite", "postgres"]


# Every aggregator's state shape, both count_distinct modes: one accumulator per alias in AGGS.
AGGREGATIONS = [
    {"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}, {"agg": "avg", "column": "v", "as": "mean"},
    {"agg": "first", "column": "page", "as": "first_page"}, {"agg": "last", "column": "page", "as": "last_page"},
    {"agg": "max", "column": "v", "as": "top"},
    {"agg": "count_distinct", "column": "page", "as": "pages", "mode": "exact", "max_distinct_values_per_group": 100},
    {"agg": "count_distinct", "column": "page", "as": "approx_pages"},
]


def _toml(tmp: Path, store: dict[str, Any], hll_precision: int = 12) -> str:
    return windowed_pipeline_toml(PIPELINE, tmp, columns="k STRING, v BIGINT, page STRING",
                                  max_files_per_trigger=None, hll_precision=hll_precision,
                                  aggregations=AGGREGATIONS, state_store=store)


AGGS = ["n", "total", "mean", "first_page", "last_page", "top", "pages", "approx_pages"]
INTEGRAL = (False, True, False, False, False, False, False, False)  # sum over a BIGINT column


def _sketch(lg_k: int = 12, values: int = 3) -> bytes:
    sk = hll_sketch(lg_k)
    for i in range(values):
        sk.update(f"page-{i}")
    return sk.serialize_compact()


def _valid_accs() -> list[Any]:
    return [3, 42, (7.5, 3), (5 * S, "home"), (59 * S, "cart"), 40, {"home", "cart"}, _sketch()]


# Three groups, all valid: a full one, the damaged target ("b" in the second window) and one with
# accumulators that never saw a value (None is every aggregator's empty accumulator).
GOOD = {
    (0, ("a",)): _valid_accs(),
    (60 * S, ("b",)): _valid_accs(),
    (60 * S, ("c",)): [1, None, None, None, None, None, None, _sketch(values=0)],
}
TARGET = (60 * S, ("b",))
TARGET_WINDOW = "1970-01-01T00:01:00Z"  # how messages name the window of TARGET


class Setup:
    """A pipeline spec, its real store with valid state committed, plain-SQL access to its tables."""

    def __init__(self, kind: str, tmp: Path, request: pytest.FixtureRequest) -> None:
        self.kind, self.tmp = kind, tmp
        if kind == "sqlite":
            self.db = tmp / "state.db"
            self.state_store = sqlite_store(self.db)
        else:
            self.dsn, self.schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
            self.state_store = postgres_store(self.dsn, self.schema)
        (tmp / "in").mkdir()
        self.spec: PipelineSpec = load_pipeline_str(_toml(tmp, self.state_store))
        self.stores: list[StateStore] = []

    def store(self) -> StateStore:
        store = make_store(self.spec.resolved().state_store)
        store.open()
        self.stores.append(store)
        return store

    def write(self, groups: dict[tuple[int, tuple], list[Any]] = GOOD, counters: dict[str, int] | None = None) -> None:
        doc = fingerprint_doc(self.spec)
        record = PipelineRecord(
            pipeline=PIPELINE, state_version=STATE_VERSION, query_id=QUERY_ID, last_batch_id=0,
            fingerprint=fingerprint(doc), fingerprint_doc=doc, watermark=30 * S,
            sources={"a": SourceProgress(max_event_ts=90 * S, last_arrival=1_000 * S)},
            counters=counters if counters is not None else {"rows_consumed:a": 9, "late_rows_dropped": 0},
            offsets={"a": OFFSET})
        size = self.spec.window.duration_ms * 1_000
        store = self.store()
        store.commit(BatchCommit(record=record))
        write_rows(store, PIPELINE, [(start, start + size, encode_key(key), encode_state(accs))
                                     for (start, key), accs in groups.items()])
        self.write_checkpoint()

    def write_checkpoint(self) -> Path:
        """The Spark checkpoint of the committed batch 0, written the way Spark writes it."""
        cp = self.tmp / "cp"
        for sub in ("offsets", "commits"):
            (cp / sub).mkdir(parents=True, exist_ok=True)
        (cp / "metadata").write_text(json.dumps({"id": QUERY_ID}) + "\n")
        (cp / "offsets" / "0").write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}\n' + OFFSET + "\n")
        (cp / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        (cp / "offsets" / ".0.crc").write_bytes(b"\x00crc")  # Spark's checksum files are hidden
        return cp

    def execute(self, statement: str, params: tuple) -> None:
        """``statement`` with {state} / {pipelines} table names and ? parameters, on the raw database."""
        if self.kind == "sqlite":
            names = migrations.sqlite_names()
            with sqlite3.connect(self.db) as conn:
                assert conn.execute(statement.format(**names), params).rowcount == 1
        else:
            names = migrations.postgres_names(self.schema)
            query = sql.SQL(statement.replace("?", "%s")).format(**names)
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                assert conn.execute(query, params).rowcount == 1

    def set_blob(self, blob: bytes, target: tuple[int, tuple] = TARGET) -> None:
        start, key = target
        self.execute("UPDATE {state} SET state_blob = ? WHERE pipeline_name = ? AND window_start = ? "
                     "AND group_key = ?", (blob, PIPELINE, start, encode_key(key)))

    def set_accs(self, accs: list[Any], target: tuple[int, tuple] = TARGET) -> None:
        self.set_blob(encode_state(accs), target)

    def set_key(self, key: tuple, target: tuple[int, tuple] = TARGET) -> None:
        self.set_key_bytes(encode_key(key), target)

    def set_key_bytes(self, key: bytes, target: tuple[int, tuple] = TARGET) -> None:
        start, old = target
        self.execute("UPDATE {state} SET group_key = ? WHERE pipeline_name = ? AND window_start = ? "
                     "AND group_key = ?", (key, PIPELINE, start, encode_key(old)))

    def set_column(self, column: str, text: str) -> None:
        cast = "::jsonb" if self.kind == "postgres" else ""
        self.execute(f"UPDATE {{pipelines}} SET {column} = ?{cast} WHERE pipeline_name = ?", (text, PIPELINE))

    def restore(self) -> Engine:
        """What ``PipelineRunner._restore`` does after the store's load."""
        store = self.store()
        engine = Engine.for_window(PIPELINE, self.spec.window, self.spec.source_names, INTEGRAL)
        restore_engine(engine, store.load(PIPELINE), store.description)
        return engine

    def close(self) -> None:
        for store in self.stores:
            store.close()


@pytest.fixture(params=KINDS, name="setup")
def setup_fixture(request, tmp_path) -> Setup:
    made = Setup(request.param, tmp_path, request)
    yield made
    made.close()


def _terminal(exc: EmatixError) -> str:
    assert exc.terminal is True
    return str(exc)


def _assert_names_target(text: str, setup: Setup, *fragments: str) -> None:
    assert repr(PIPELINE) in text, text
    assert setup.store().description in text, text
    assert TARGET_WINDOW in text and "('b',)" in text, text
    for fragment in fragments:
        assert fragment in text, text
    assert "reset PIPELINE.toml --yes" in text and "backup" in text, text


def _with(index: int, value: Any) -> list[Any]:
    accs = _valid_accs()
    accs[index] = value
    return accs
