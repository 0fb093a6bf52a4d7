"""Corrupt inputs end as terminal ``EmatixError``s that name the cause, never as raw tracebacks (issue 7).

A real pipeline's state is written with the real store (SQLite and PostgreSQL), damaged with
plain SQL, and then loaded the way a run restores it (``store.load`` -> ``loaded_groups.decode_groups`` ->
``Engine.restore``) and the way ``ematix-dagster check`` inspects it. Checkpoint files are damaged
on disk. Each case asserts the error class, ``terminal is True`` and that the message names what
is wrong and where (pipeline, store, window and group, column, file). No Spark is started.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest
from datasketches import hll_sketch
from psycopg import sql

from ematix_dagster.errors import CorruptCheckpoint, CorruptState, EmatixError
from ematix_dagster.fingerprint import fingerprint, fingerprint_doc
from ematix_dagster.operations import check
from ematix_dagster.spark import checkpoint
from ematix_dagster.spec import PipelineSpec, load_pipeline_str
from ematix_dagster.stores import make_store
from ematix_dagster.streaming.durable import restore_engine
from ematix_dagster.streaming.micro_batch import BatchInput, Engine, SourceStats
from state_store import migrations
from state_store.base import BatchCommit, PipelineRecord, SourceProgress, StateStore
from state_store.codec import STATE_VERSION, encode_key, encode_state
from tests.pipeline_toml import postgres_store, sqlite_store, windowed_pipeline_toml

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
        self.store().commit(BatchCommit(record=record, upserts=[
            (start, start + size, encode_key(key), encode_state(accs)) for (start, key), accs in groups.items()]))
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
        start, old = target
        self.execute("UPDATE {state} SET group_key = ? WHERE pipeline_name = ? AND window_start = ? "
                     "AND group_key = ?", (encode_key(key), PIPELINE, start, encode_key(old)))

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


@pytest.fixture(params=KINDS)
def setup(request, tmp_path) -> Setup:
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


# ---- 1. well-formed but wrongly shaped blobs, restored as a run restores them -------------------

def _with(index: int, value: Any) -> list[Any]:
    accs = _valid_accs()
    accs[index] = value
    return accs


SHAPES = [  # (case id, accumulators stored for TARGET, fragments the message must contain)
    ("count-is-text", _with(0, "3"), ["'n' (count)", "str '3'"]),
    ("count-is-bool", _with(0, True), ["'n' (count)", "bool True"]),
    ("integer-sum-is-float", _with(1, 4.5), ["'total' (sum)", "integer sum"]),
    ("avg-triple", _with(2, (7.5, 3, 1)), ["'mean' (avg)", "(7.5, 3, 1)"]),
    ("avg-single", _with(2, (7.5,)), ["'mean' (avg)", "(7.5,)"]),
    ("avg-count-is-text", _with(2, (7.5, "3")), ["'mean' (avg)"]),
    ("avg-is-float", _with(2, 2.5), ["'mean' (avg)", "float 2.5"]),
    ("first-single", _with(3, (5 * S,)), ["'first_page' (first)", "pair"]),
    ("first-time-is-text", _with(3, ("5", "home")), ["'first_page' (first)"]),
    ("last-value-is-pair", _with(4, (59 * S, (1, 2))), ["'last_page' (last)"]),
    ("last-is-set", _with(4, {"cart"}), ["'last_page' (last)", "set"]),
    ("max-is-tuple", _with(5, (1, 2)), ["'top' (max)", "tuple"]),
    ("exact-distinct-is-int", _with(6, 2), ["'pages' (count_distinct)", "set of distinct values"]),
    ("hll-is-text", _with(7, "sketch"), ["'approx_pages' (count_distinct)", "HLL sketch (bytes)"]),
    ("hll-is-garbage-bytes", _with(7, b"not a sketch at all"), ["'approx_pages' (count_distinct)", "HLL"]),
    ("hll-is-short", _with(7, b"\x02\x01"), ["'approx_pages' (count_distinct)", "HLL"]),
    ("hll-other-precision", _with(7, _sketch(lg_k=10)), ["'approx_pages' (count_distinct)", "lg_k 10"]),
    ("one-accumulator-missing", _valid_accs()[:-1], ["7 accumulators", "8 aggregations"]),
    ("one-accumulator-too-many", _valid_accs() + [1], ["9 accumulators", "8 aggregations"]),
    ("no-accumulators", [], ["0 accumulators"]),
]


@pytest.mark.parametrize("accs,fragments", [pytest.param(a, f, id=i) for i, a, f in SHAPES])
def test_restore_refuses_wrongly_shaped_state(setup, accs, fragments):
    setup.write()
    assert setup.restore().state.group_count == 3  # the valid state restores
    setup.set_accs(accs)
    with pytest.raises(CorruptState) as info:
        setup.restore()
    _assert_names_target(_terminal(info.value), setup, *fragments)


def test_restore_refuses_a_key_of_another_width(setup):
    setup.write()
    setup.set_key(("b", "extra"))
    with pytest.raises(CorruptState) as info:
        setup.restore()
    text = _terminal(info.value)
    assert repr(PIPELINE) in text and setup.store().description in text and TARGET_WINDOW in text
    assert "('b', 'extra')" in text and "group_by column ['k']" in text


def test_valid_state_restores_and_continues(setup):
    """The shapes the engine writes pass (sets for exact distinct, None, empty sketches) and still merge."""
    setup.write()
    engine = setup.restore()
    assert engine.state.windows[60 * S][("c",)][1:7] == [None] * 6
    assert engine.state.windows[0][("a",)][6] == {"home", "cart"}
    engine.process(BatchInput(batch_id=1, batch_time=2_000 * S, sources={"a": SourceStats(rows=1)},
                              starts=[60 * S], keys=[("b",)],
                              partials=[[1], [1], [(1.0, 1)], [(61 * S, "a")], [(61 * S, "z")], [1], [["p"]],
                                        [_sketch(values=5)]]))
    assert engine.state.windows[60 * S][("b",)][0] == 4


def test_a_truncated_sketch_fails_terminally_when_it_is_merged(setup):
    """The restore looks at sketch headers only (cheap); a sketch cut short fails when opened, naming its group."""
    setup.write()
    setup.set_accs(_with(7, _sketch(values=3)[:-2]))
    engine = setup.restore()
    with pytest.raises(CorruptState) as info:
        engine.process(BatchInput(batch_id=1, batch_time=2_000 * S, sources={"a": SourceStats(rows=1)},
                                  starts=[60 * S], keys=[("b",)],
                                  partials=[[1], [1], [(1.0, 1)], [(61 * S, "a")], [(61 * S, "z")], [1], [["p"]],
                                            [_sketch(values=5)]]))
    text = _terminal(info.value)
    assert "HLL sketch is corrupt" in text and "approx_pages" in text and "('b',)" in text and PIPELINE in text


# ---- 2. ematix-dagster check decodes and vets every blob ----------------------------------------

def _codes(spec: PipelineSpec) -> list[str]:
    return [p.code for p in check(spec).problems]


def _corrupt_state_problem(spec: PipelineSpec):
    report = check(spec)
    assert [p.code for p in report.problems] == ["corrupt_state"], [str(p) for p in report.problems]
    problem = report.problems[0]
    assert "backup" in problem.fix and "ematix-dagster reset PIPELINE.toml --yes" in problem.fix
    assert not report.healthy
    return problem


CHECKED = [  # (case id, how TARGET's row is damaged, fragments of the problem's message)
    ("count-is-text", lambda s: s.set_accs(_with(0, "3")), [TARGET_WINDOW, "('b',)", "'n' (count)"]),
    ("avg-triple", lambda s: s.set_accs(_with(2, (7.5, 3, 1))), ["('b',)", "'mean' (avg)"]),
    ("hll-garbage", lambda s: s.set_accs(_with(7, b"not a sketch at all")), ["('b',)", "approx_pages"]),
    ("hll-truncated", lambda s: s.set_accs(_with(7, _sketch(values=3)[:-2])),
     ["('b',)", "approx_pages", "not a DataSketches HLL sketch image"]),
    ("accumulator-missing", lambda s: s.set_accs(_valid_accs()[:-1]), ["('b',)", "7 accumulators"]),
    ("blob-does-not-decode", lambda s: s.set_blob(bytes([STATE_VERSION]) + b"\xc1\xc1"),
     ["window 60000000", "('b',)", "does not decode"]),
    ("blob-version-byte", lambda s: s.set_blob(b"\x00garbage"), ["window 60000000", "no valid version byte"]),
    ("counters-not-json", lambda s: s.set_column("counters", '["rows", 3]'), ["'counters'"]),
]


@pytest.mark.parametrize("damage,fragments", [pytest.param(d, f, id=i) for i, d, f in CHECKED])
def test_check_reports_corrupt_state(setup, damage, fragments):
    setup.write()
    report = check(setup.spec)
    assert report.healthy, [str(p) for p in report.problems]
    damage(setup)
    problem = _corrupt_state_problem(setup.spec)
    assert PIPELINE in problem.message
    for fragment in fragments:
        assert fragment in problem.message, problem.message


def test_check_does_not_call_state_of_another_window_shape_corrupt(setup):
    """A changed spec is fingerprint_changed; its aggregations are not held against the stored blobs."""
    setup.write()
    changed = load_pipeline_str(_toml(setup.tmp, setup.state_store, hll_precision=14))
    assert _codes(changed) == ["fingerprint_changed"]  # the stored sketches have lg_k 12, not 14
    setup.set_accs(_with(0, "3"))
    assert _codes(setup.spec) == ["corrupt_state"]


# ---- 3. the pipelines row: JSON columns -----------------------------------------------------------

ROWS = [  # (case id, column, stored text, kinds, fragment)
    ("counters-invalid-json", "counters", "{not json", ["sqlite"], "not valid JSON"),
    ("counters-truncated", "counters", '{"rows": 3', ["sqlite"], "not valid JSON"),
    ("counters-array", "counters", "[1, 2]", KINDS, "JSON object"),
    ("counters-text-value", "counters", '{"rows_consumed:a": "many"}', KINDS, "not an integer"),
    ("counters-string", "counters", '"rows"', KINDS, "counters"),
    ("sources-invalid-json", "sources", "[[", ["sqlite"], "not valid JSON"),
    ("sources-object", "sources", '{"a": 1}', KINDS, "JSON array"),
    ("sources-short-entry", "sources", '[["a", 1]]', KINDS, "source name"),
    ("sources-text-time", "sources", '[["a", "soon", null]]', KINDS, "source name"),
    ("fingerprint-doc-array", "fingerprint_doc", "[1]", KINDS, "JSON object"),
]


@pytest.mark.parametrize("kind_,column,text,fragment", [
    pytest.param(kind, column, text, fragment, id=f"{kind}-{case}")
    for case, column, text, kinds, fragment in ROWS for kind in kinds])
def test_pipelines_row_with_bad_json_is_corrupt_state(kind_, column, text, fragment, tmp_path, request):
    setup = Setup(kind_, tmp_path, request)
    try:
        setup.write()
        setup.set_column(column, text)
        with pytest.raises(CorruptState) as info:
            setup.store().load(PIPELINE, groups=False)
        message = _terminal(info.value)
        assert repr(PIPELINE) in message and setup.store().description in message, message
        assert f"column {column!r}" in message and fragment in message, message
        assert "reset PIPELINE.toml --yes" in message
    finally:
        setup.close()


# ---- 4. Spark checkpoint files --------------------------------------------------------------------

CHECKPOINT_FILES: list[tuple[str, str, bytes, Callable[[str], Any], str]] = [
    # (case id, file, content, reader, fragment)
    ("offsets-empty", "offsets/0", b"", lambda cp: checkpoint.read_offsets(cp, 0), "empty"),
    ("offsets-version-only", "offsets/0", b"v1\n", lambda cp: checkpoint.read_offsets(cp, 0), "line 2"),
    ("offsets-bad-version", "offsets/0", b'{"batchTimestampMs":1}\n{}\n{}\n',
     lambda cp: checkpoint.read_offsets(cp, 0), "log version"),
    ("offsets-metadata-not-json", "offsets/0", b"v1\n{batchTimestampMs: 1}\n" + OFFSET.encode(),
     lambda cp: checkpoint.read_offsets(cp, 0), "not JSON"),
    ("offsets-no-timestamp", "offsets/0", b'v1\n{"batchWatermarkMs":0}\n' + OFFSET.encode(),
     lambda cp: checkpoint.read_offsets(cp, 0), "batchTimestampMs"),
    ("offsets-text-timestamp", "offsets/0", b'v1\n{"batchTimestampMs":"now"}\n' + OFFSET.encode(),
     lambda cp: checkpoint.read_offsets(cp, 0), "batchTimestampMs"),
    ("offsets-no-source-offsets", "offsets/0", b'v1\n{"batchTimestampMs":1}\n',
     lambda cp: checkpoint.read_offsets(cp, 0), "no source offsets"),
    ("offsets-binary", "offsets/0", b"\xff\xfe\x00garbage", lambda cp: checkpoint.read_offsets(cp, 0), "UTF-8"),
    ("metadata-empty", "metadata", b"", checkpoint.query_id, "line 1"),
    ("metadata-not-json", "metadata", b"id=abc\n", checkpoint.query_id, "not JSON"),
    ("metadata-array", "metadata", b'["abc"]\n', checkpoint.query_id, "query id"),
    ("metadata-no-id", "metadata", b'{"name":"q"}\n', checkpoint.query_id, "query id"),
    ("source-log-not-json", "sources/0/0", b"v1\nnot json\n", lambda cp: checkpoint.source_log(cp, 0, 0), "not JSON"),
]


@pytest.mark.parametrize("name,content,read,fragment",
                         [pytest.param(n, c, r, f, id=i) for i, n, c, r, f in CHECKPOINT_FILES])
def test_garbage_checkpoint_file_is_corrupt_checkpoint(tmp_path, name, content, read, fragment):
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    (cp / "offsets" / "0").write_text('v1\n{"batchTimestampMs":1700000000000}\n' + OFFSET + "\n")
    (cp / "commits" / "0").write_text("v1\n{}\n")
    (cp / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    path = cp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpoint) as info:
        read(str(cp))
    text = _terminal(info.value)
    assert str(path) in text and fragment in text, text
    assert f"Restore the checkpoint directory {cp}" in text and "reset PIPELINE.toml --yes" in text


def test_spark_format_checkpoint_reads(tmp_path):
    """The control: Spark's own files read as before; its .crc / .tmp files and stray names are ignored."""
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    for batch in (0, 1, 10):
        (cp / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":%d,"conf":{"k":"v"}}\n{"logOffset":%d}\n-\n'
            % (1700000000000 + batch, batch))
        (cp / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        (cp / "commits" / f".{batch}.crc").write_bytes(b"\x00")
    (cp / "offsets" / f".11.{uuid.uuid4()}.tmp").write_text("half written")
    for stray in ("commits/1.bak", "commits/\u00b2", "offsets/latest"):  # ignored, as Spark ignores them
        (cp / stray).write_text("v1\n")
    (cp / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    loc = f"file://{cp}"
    assert checkpoint.read_offsets(loc, 10) == checkpoint.BatchOffsets(10, 1700000000010, ('{"logOffset":10}', "-"))
    assert checkpoint.committed_batches(loc) == [0, 1, 10]
    assert checkpoint.has_progress(loc) is True
    assert checkpoint.query_id(loc) == QUERY_ID
    assert checkpoint.committed_batches(str(tmp_path / "missing")) == []
    assert checkpoint.query_id(str(tmp_path / "missing")) is None


def test_check_reports_corrupt_checkpoint(setup):
    setup.write()
    assert check(setup.spec).healthy
    (setup.tmp / "cp" / "offsets" / "0").write_text("v1\n")
    report = check(setup.spec)
    assert [p.code for p in report.problems] == ["corrupt_checkpoint"], [str(p) for p in report.problems]
    problem = report.problems[0]
    assert str(setup.tmp / "cp" / "offsets" / "0") in problem.message
    assert "backup" in problem.fix and "reset PIPELINE.toml --yes" in problem.fix


def test_check_groups_vets_decoded_state_before_spark_knows_the_column_types(tmp_path, request):
    """``check_groups`` (for a run's preflight and for ``check``): no Spark, so sums may be int, float or decimal."""
    from ematix_dagster.streaming.micro_batch import check_groups
    from ematix_dagster.streaming.state.base import StoredGroup

    window = Setup("sqlite", tmp_path, request).spec.window
    good = [StoredGroup(start, None, key, accs) for (start, key), accs in GOOD.items()]
    check_groups(PIPELINE, window, good)
    float_sum = StoredGroup(0, None, ("d",), _with(1, 4.5))
    check_groups(PIPELINE, window, good + [float_sum])  # a float sum: the column type is unknown
    for thorough in (False, True):
        with pytest.raises(CorruptState) as info:
            check_groups(PIPELINE, window, good + [StoredGroup(0, None, ("d",), _with(2, (7.5, 3, 1)))], "the store",
                         thorough=thorough)
        text = _terminal(info.value)
        assert "pipeline 'corrupt-inputs' in the store" in text and "('d',)" in text and "'mean' (avg)" in text
    with pytest.raises(CorruptState):
        check_groups(PIPELINE, window, good + [float_sum], integral=INTEGRAL)
