"""A row pipeline's release rules on the driver (``streaming/row_release.py``; no Spark), against a
pandas oracle of docs/contract/row-pipelines.md applied batch by batch: every row leaves in the first
batch whose watermark (after the batch's advance) reaches its release time, in release order, once.
"""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pytest

from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.streaming.micro_batch import SourceStats
from ematix_dagster.streaming.row_release import RowBatch, RowEngine
from ematix_dagster.streaming.watermark import Watermarks

NOW = -(2**63)


def _oracle(batches: list[pd.DataFrame], lateness: int) -> list[list[tuple]]:
    """Per batch, the (id, v) rows written, in order: pandas over all rows seen so far."""
    records: list[dict] = []
    written: set[int] = set()
    w = None
    out = []
    for b, rows in enumerate(batches):
        if len(rows):
            top = int(rows["event"].max()) - lateness
            w = top if w is None else max(w, top)
        records += rows.assign(arrival=b).to_dict("records")
        if not records:
            out.append([])
            continue
        seen = pd.DataFrame.from_records(records)
        due = seen[seen["release"].notna() & ~seen["id"].isin(written)]
        due = due[(due["release"] == NOW) | ((w is not None) & (due["release"] <= (w if w is not None else 0)))]
        due = due.sort_values(["release", "arrival", "event", "id", "v"], kind="stable")
        written.update(due["id"])
        out.append(list(zip(due["id"].astype(int), due["v"])))
    return out


def _batches(seed: int) -> list[pd.DataFrame]:
    rng = random.Random(seed)
    batches, next_id = [], 0
    for b in range(8):
        rows = []
        for _ in range(rng.randint(0, 6)):
            event = b * 10 + rng.randint(-8, 8)
            release = rng.choice([None, NOW, event, event + rng.randint(1, 25), event - 3])
            rows.append({"id": next_id, "v": rng.choice(["x", "y", None]), "event": event, "release": release})
            next_id += 1
        batches.append(pd.DataFrame(rows, columns=["id", "v", "event", "release"]))
    return batches


class _Store:
    """The held rows as a store keeps them: inserted and deleted by each commit, loaded by bound."""

    def __init__(self) -> None:
        self.rows: dict = {}

    def due(self, w: int):
        return [self.rows[k] for k in sorted(k for k in self.rows if k[0] <= w)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("restart", [False, True])
def test_rows_leave_in_the_first_batch_whose_watermark_reaches_them(seed: int, restart: bool) -> None:
    batches, lateness = _batches(seed), 4
    expected = _oracle(batches, lateness)
    store = _Store()

    def engine() -> RowEngine:
        return RowEngine(Watermarks(lateness=lateness, idleness=10**12, sources=("s",)), max_buffered_rows=1_000)

    eng = engine()
    got, held_then_released = [], 0
    for b, rows in enumerate(batches):
        table = pa.table({"id": pa.array(rows["id"].tolist(), pa.int64()), "v": pa.array(rows["v"].tolist(), pa.string()),
                          "_release_us": pa.array([None if pd.isna(r) else int(r) for r in rows["release"]], pa.int64()),
                          "_event_us": pa.array(rows["event"].tolist(), pa.int64())})
        stats = {"s": SourceStats(rows=len(rows), max_event_ts=int(rows["event"].max()) if len(rows) else None)}
        result = eng.process(RowBatch(b, b, stats, table), store.due)
        if result.changes.released_up_to is not None:  # the store's range delete
            released = [key for key in store.rows if key[0] <= result.changes.released_up_to]
            held_then_released += len(released)
            for key in released:
                del store.rows[key]
        for row in result.changes.inserts:
            store.rows[row.key] = row
        got.append(list(zip(result.released.column("id").to_pylist(), result.released.column("v").to_pylist())))
        assert result.released.column_names == ["id", "v"]
        assert result.pending == len(store.rows)
        if restart:  # a new engine from what a store keeps: the watermark and the held rows' count
            w, eng = eng.watermarks.global_wm, engine()
            eng.watermarks.global_wm, eng.pending = w, len(store.rows)
            eng.watermarks.clocks["s"].max_event_ts = None if w is None else w + lateness
    assert got == expected
    assert held_then_released  # the data holds rows back and releases them later


def test_max_buffered_rows_fails_loud_naming_the_bound() -> None:
    eng = RowEngine(Watermarks(lateness=0, idleness=10**12, sources=("s",)), max_buffered_rows=1, pipeline="p")
    table = pa.table({"id": [1, 2], "_release_us": [100, 200], "_event_us": [1, 2]})
    with pytest.raises(StateCapExceeded, match="2 rows would be held back.*max_buffered_rows = 1"):
        eng.process(RowBatch(0, 0, {"s": SourceStats(rows=2, max_event_ts=2)}, table), lambda w: [])


def test_held_time_values_come_back_as_they_went_in() -> None:
    """Timestamps (UTC µs), dates, decimals, NULLs and nested values (lists, structs holding a
    timestamp, maps) survive being held and released."""
    import datetime as dt
    from decimal import Decimal

    ts, ts_type = [dt.datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=dt.timezone.utc), None], pa.timestamp("us", tz="UTC")
    rows = pa.table({"t": pa.array(ts, ts_type),
                     "d": pa.array([dt.date(2026, 1, 2), None], pa.date32()),
                     "m": pa.array([Decimal("1.50"), None], pa.decimal128(9, 2)),
                     "l": pa.array([["a", None], None], pa.list_(pa.string())),
                     "s": pa.array([{"n": 1, "at": ts[0]}, None], pa.struct([("n", pa.int64()), ("at", ts_type)])),
                     "kv": pa.array([[("k", Decimal("2.5"))], None], pa.map_(pa.string(), pa.decimal128(5, 1))),
                     "_release_us": [100, 100], "_event_us": [1, 2]})
    store = _Store()
    eng = RowEngine(Watermarks(lateness=0, idleness=10**12, sources=("s",)), max_buffered_rows=10)
    first = eng.process(RowBatch(0, 0, {"s": SourceStats(rows=2, max_event_ts=2)}, rows), store.due)
    store.rows = {row.key: row for row in first.changes.inserts}
    later = eng.process(RowBatch(1, 1, {"s": SourceStats(rows=0, max_event_ts=100)}, rows.slice(0, 0)), store.due)
    assert first.released.num_rows == 0 and later.changes.released_up_to == 100 == later.watermark
    assert later.released.to_pydict() == {"t": ts, "d": [dt.date(2026, 1, 2), None], "m": [Decimal("1.50"), None],
                                          "l": [["a", None], None], "s": [{"n": 1, "at": ts[0]}, None],
                                          "kv": [[("k", Decimal("2.5"))], None]}
    assert later.released.schema == rows.select(["t", "d", "m", "l", "s", "kv"]).schema


def test_a_row_pipeline_counts_its_input_as_a_windowed_one_does() -> None:
    """Rows consumed, bad event times and dead letters under the counters' names a windowed pipeline stores."""
    eng = RowEngine(Watermarks(lateness=0, idleness=10**12, sources=("s",)), max_buffered_rows=10, pipeline="p")
    table = pa.table({"id": [1, 2], "_release_us": pa.array([None, None], pa.int64()), "_event_us": [1, 2]})
    stats = {"s": SourceStats(rows=5, max_event_ts=2, invalid=1, future=1, malformed=1)}
    for b in range(2):
        eng.process(RowBatch(b, b, stats, table, dead_letters={"invalid_event_time": 1, "malformed": 1}), lambda w: [])
    assert {k: v for k, v in eng.counters.items() if k.endswith((":s", "_time", ":malformed"))} == {
        "rows_consumed:s": 10, "invalid_event_time_rows:s": 2, "future_rows:s": 2, "malformed_rows:s": 2,
        "dead_letter_rows:invalid_event_time": 2, "dead_letter_rows:malformed": 2}
