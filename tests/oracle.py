"""Ground truth for docs/contract/time-and-watermarks.md and docs/contract/windows.md: a slow, literal pandas re-statement of the batch-by-batch rules.

It deliberately shares no code with ``ematix_dagster`` and makes no attempt to be fast: window
state is the list of raw rows each window took (aggregates are recomputed from them at every
emission), and every rule is one visible line that quotes the contract's sentence it implements
(docs/contract/).

Input: one :class:`Batch` per micro-batch, in order, each a DataFrame with the columns

* ``_source``   the source name,
* ``_event_ts`` event time in µs since the epoch (``None``/NaN/<NA> = invalid: null or unparseable),
* ``_malformed`` (optional, bool) the row is a malformed json/csv line,
* the group-by and value columns (and anything else, e.g. an ``id`` kept for matching),

plus the batch time in µs (the test reads it from the checkpoint's ``offsets/N``).

Output (:class:`OracleResult`): for every batch id (the ``end_of_input = "flush"`` rows count
with the last batch, whose directory they are written to), the emitted rows (``window_start``/``window_end`` µs, group columns, aggregates,
``_emit_kind``), the dead-letter rows, the watermark after the batch, and the counters of
docs/contract/operations.md.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

MS = 1_000  # µs per ms


@dataclass(frozen=True)
class Params:
    sources: tuple[str, ...]
    duration_ms: int
    hop_ms: int | None = None  # None: tumbling (the hop is the duration)
    lateness_ms: int = 0
    source_idleness_ms: int = 60_000
    late_data: str = "drop"  # drop | reopen | dlq
    allowed_lateness_ms: int = 0  # reopen only
    max_future_skew_ms: int = 3_600_000  # for every source
    group_by: tuple[str, ...] = ()
    #: (agg, column, alias) with agg in count | count_col | sum | count_distinct (exact)
    aggregations: tuple[tuple[str, str | None, str], ...] = (("count", None, "n"),)
    #: the [transform] sql as a row predicate on the valid rows (None: no SQL)
    sql_filter: Callable[[pd.DataFrame], pd.Series] | None = None
    dead_letter: bool = False  # a [dead_letter] target is configured
    end_of_input: str = "keep"  # keep | flush


@dataclass
class Batch:
    rows: pd.DataFrame
    time_us: int


@dataclass
class OracleResult:
    emitted: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # batch id -> rows
    dead_letters: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # batch id -> rows
    watermarks: dict[int, int | None] = field(default_factory=dict)  # batch id -> W after it
    counters: Counter[str] = field(default_factory=Counter)
    windows_left_open: int = 0  # windows never emitted at the end of the run


def window_starts(t: int, duration: int, hop: int) -> list[int]:
    """docs/contract/windows.md: every start that is a multiple of the hop in (t − D, t]."""
    last = (t // hop) * hop  # the greatest multiple of hop <= t (floor division, also for t < 0)
    return sorted(range(last, t - duration, -hop))  # last, last-hop, ... while start > t - D


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v))


def _aggregate(rows: list[dict[str, Any]], aggregations) -> dict[str, Any]:
    """docs/contract/aggregators.md NULL rules: count(*) counts every row, everything else skips NULL inputs."""
    out: dict[str, Any] = {}
    for agg, column, alias in aggregations:
        values = [] if column is None else [r[column] for r in rows if not _missing(r[column])]
        if agg == "count":
            out[alias] = len(rows)
        elif agg == "count_col":
            out[alias] = len(values)
        elif agg == "sum":
            out[alias] = sum(values) if values else None  # SQL sum of no values is NULL
        elif agg == "count_distinct":
            out[alias] = len(set(values))  # exact mode; the empty string is a value
        else:
            raise ValueError(f"the oracle does not implement {agg}")
    return out


def _key(row: dict[str, Any], group_by) -> tuple[Any, ...]:
    # NULL group keys are a group of their own (docs/contract/aggregators.md): normalise every missing value to None.
    return tuple(None if _missing(row[g]) else row[g] for g in group_by)


def run(batches: list[Batch], p: Params) -> OracleResult:
    D = p.duration_ms * MS
    hop = (p.hop_ms or p.duration_ms) * MS
    lateness = p.lateness_ms * MS
    idleness = p.source_idleness_ms * MS
    # Under reopen an emitted window is retained (still open to rows) until end + allowed_lateness <= W.
    retention = p.allowed_lateness_ms * MS if p.late_data == "reopen" else 0

    res = OracleResult()
    W: int | None = None  # the global watermark; None is -inf
    max_ts: dict[str, int | None] = {s: None for s in p.sources}
    # "at the first batch of a run every source counts as just arrived"
    last_arrival = {s: batches[0].time_us for s in p.sources} if batches else {}
    # window start -> [(group key, row)] of the rows it took; a window exists once it took a row
    state: dict[int, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}

    def emitted_rows(start: int, keys: set[tuple[Any, ...]], kind: str) -> list[dict[str, Any]]:
        rows = []
        for key in keys:
            mine = [r for k, r in state[start] if k == key]
            rows.append({"window_start": start, "window_end": start + D, **dict(zip(p.group_by, key)),
                         **_aggregate(mine, p.aggregations), "_emit_kind": kind})
        return rows

    def evict() -> None:
        # "state is evicted when end + allowed_lateness <= W" (allowed_lateness is 0 unless reopen)
        for start in [s for s in state if W is not None and s + D + retention <= W]:
            del state[start]

    for batch_id, batch in enumerate(batches):
        t_batch = batch.time_us
        df = batch.rows.copy()
        if "_malformed" not in df.columns:
            df["_malformed"] = False
        records = df.to_dict("records")
        W_prev = W
        dead: list[dict[str, Any]] = []

        # 1. Classify every row before the SQL: malformed, then invalid, then future (the DLQ reason).
        valid: list[dict[str, Any]] = []
        for r in records:
            s = r["_source"]
            res.counters[f"rows:{s}"] += 1
            if not _missing(r["_malformed"]) and r["_malformed"]:  # rows without the flag are not malformed
                reason = "malformed"
            elif _missing(r["_event_ts"]):
                reason = "invalid_event_time"
            elif int(r["_event_ts"]) > t_batch + p.max_future_skew_ms * MS:
                reason = "future"
            else:
                r["_event_ts"] = int(r["_event_ts"])
                valid.append(r)
                continue
            res.counters[f"{reason}:{s}"] += 1
            dead.append({**r, "_reason": reason})

        # 2. Per-source watermark inputs are measured before the SQL (filtered rows advance time);
        #    any row at all (even a bad one) counts as an arrival for idleness.
        for s in p.sources:
            ts = [r["_event_ts"] for r in valid if r["_source"] == s]
            if ts and (max_ts[s] is None or max(ts) > max_ts[s]):
                max_ts[s] = max(ts)
            if any(r["_source"] == s for r in records):
                last_arrival[s] = t_batch

        # 3. The SQL (a row filter here) sees only the valid rows.
        if p.sql_filter is not None and valid:
            keep = p.sql_filter(pd.DataFrame(valid)).tolist()
            valid = [r for r, k in zip(valid, keep) if k]

        # 4. Lateness per (row, window) against the watermark BEFORE this batch.
        touched: dict[int, set[tuple[Any, ...]]] = {}
        for r in valid:
            starts = window_starts(r["_event_ts"], D, hop)
            open_ = [s for s in starts if W_prev is None or s + D + retention > W_prev]
            if not open_:
                res.counters["late_rows"] += 1
                if p.late_data == "dlq":
                    dead.append({**r, "_reason": "late"})
                continue
            res.counters["late_assignments"] += len(starts) - len(open_)
            if p.late_data == "reopen" and any(W_prev is not None and s + D <= W_prev for s in open_):
                res.counters["reopened_rows"] += 1  # it reached an already-emitted, retained window
            key = _key(r, p.group_by)
            for s in open_:
                state.setdefault(s, []).append((key, r))
                touched.setdefault(s, set()).add(key)

        # 5. W = max(W_prev, min(wm_s over non-idle sources)); a non-idle source never seen is -inf;
        #    if every source is idle W stays.
        active = [s for s in p.sources if not t_batch - last_arrival[s] > idleness]
        if active and all(max_ts[s] is not None for s in active):
            candidate = min(max_ts[s] - lateness for s in active)
            W = candidate if W is None else max(W, candidate)

        # 6. Emit: windows closing now (end <= W, not emitted before: end > W_prev) once as final;
        #    windows emitted before (end <= W_prev) that took rows now re-emit the touched groups.
        out: list[dict[str, Any]] = []
        for start in sorted(state):
            end = start + D
            if W_prev is not None and end <= W_prev:
                if start in touched:
                    out += emitted_rows(start, touched[start], "correction")
            elif W is not None and end <= W:
                out += emitted_rows(start, {k for k, _ in state[start]}, "final")
        evict()

        res.emitted[batch_id] = out
        res.watermarks[batch_id] = W
        if p.dead_letter:
            res.dead_letters[batch_id] = dead
            for r in dead:
                res.counters[f"dead_letter:{r['_reason']}"] += 1

    # end_of_input = "flush": every window still open is emitted (beside the last batch's rows, in
    # that batch's directory) and closed for good.
    if p.end_of_input == "flush" and state:
        W_prev = W
        W = max(x for x in (W_prev, max(state) + D) if x is not None)
        out = [row for start in sorted(state) if W_prev is None or start + D > W_prev
               for row in emitted_rows(start, {k for k, _ in state[start]}, "final")]
        evict()
        res.emitted.setdefault(len(batches) - 1, []).extend(out)
        res.watermarks[len(batches) - 1] = W

    res.windows_left_open = sum(1 for start in state if W is None or start + D > W)
    for rows in res.emitted.values():
        for r in rows:
            res.counters["finals" if r["_emit_kind"] == "final" else "corrections"] += 1
    return res
