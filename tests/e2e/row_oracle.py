"""Ground truth for row pipelines (docs/contract/row-pipelines.md): a literal, slow re-statement
of the batch-by-batch rules in plain Python over pandas rows.

It shares no code with ``ematix_dagster``: the SQL is given as Python functions (the SELECT list, an
ordinary WHERE, or the ``WATERMARK_TS()`` WHERE as its OR branches), the watermark is §2's, and every
rule is one visible line quoting the contract sentence it implements.

Input: one ``(batch time µs, DataFrame)`` per micro-batch, in order (the test reads the batch times
from the checkpoint's ``offsets/N``), each frame with ``_source``, ``_event_ts`` (µs; None/NaN =
invalid), optionally ``_malformed`` (a bad json/csv line) and the payload columns.

Output: per batch, the watermark after it, the rows it writes in §11's order, the rows it holds back,
the rows no branch releases, the rows an ordinary WHERE drops and the dead letters (reason, row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

Row = dict[str, Any]
MS = 1_000
#: a guard-only branch's release time: "now", before any timed release in the order
NOW = float("-inf")


class SqlError(Exception):
    """Raised by a SELECT item or a release expression that fails on a row (an ANSI cast)."""


@dataclass(frozen=True)
class Branch:
    """One OR branch: ``guard`` (None: no static condition) and the upper bound ``at <= WATERMARK_TS()``
    (``strict``: ``<``); ``at`` None is a guard-only branch."""

    guard: Callable[[Row], bool | None] | None = None
    at: Callable[[Row], int | None] | None = None
    strict: bool = False


@dataclass(frozen=True)
class Query:
    """The SQL: ``select`` gives the output row (SELECT order); ``where`` an ordinary WHERE (None/False:
    filtered); ``branches`` a WHERE with WATERMARK_TS()."""

    select: Callable[[Row], Row]
    where: Callable[[Row], bool | None] | None = None
    branches: tuple[Branch, ...] | None = None


@dataclass(frozen=True)
class Params:
    sources: tuple[str, ...] = ("a",)
    lateness_ms: int = 0
    source_idleness_ms: int = 60_000
    max_future_skew_ms: int = 3_600_000


@dataclass
class Held:
    release: float  # µs (or NOW)
    arrival: int
    event_ts: int
    row: Row  # the output row
    source_row: Row  # the input row (for matching by id)


@dataclass
class BatchOut:
    watermark: int | None
    released: list[Held] = field(default_factory=list)  # in release order
    held: list[Held] = field(default_factory=list)  # pending after the batch
    not_released: list[Row] = field(default_factory=list)
    filtered: list[Row] = field(default_factory=list)  # reason "where"
    dead: list[tuple[str, Row]] = field(default_factory=list)

    @property
    def rows(self) -> list[Row]:
        return [h.row for h in self.released]


def missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT


def _value_key(row: Row) -> tuple:
    # "values in SELECT order", NULLs first (as Spark orders ascending)
    return tuple((0, 0) if missing(v) else (1, v) for v in row.values())


def order_key(h: Held) -> tuple:
    """§11: "ordered by (release time, arrival batch, _event_ts, values in SELECT order)"."""
    return (h.release, h.arrival, h.event_ts, _value_key(h.row))


def release_time(r: Row, branches: tuple[Branch, ...]) -> float | None:
    """§11: "the minimum over branches whose guard is TRUE of that branch's expr (a guard-only branch
    means now; `<` means strictly after; a NULL expr means that branch never releases)". Raises
    SqlError when an applying branch's expr fails; the result does not depend on branch order."""
    times: list[float] = []
    for b in branches:
        if b.guard is not None and b.guard(r) is not True:  # FALSE or NULL: the branch does not apply
            continue
        if b.at is None:
            times.append(NOW)
            continue
        t = b.at(r)  # may raise SqlError: "a failing release expression ... sql_error, never 'never'"
        if t is not None:
            times.append(t + 1 if b.strict else t)  # strictly after: the first µs past expr
    return min(times) if times else None


def run(batches: list[tuple[int, pd.DataFrame]], query: Query, p: Params,
        held: list[Held] | None = None, watermark: int | None = None, first_batch: int = 0) -> list[BatchOut]:
    lateness, idleness = p.lateness_ms * MS, p.source_idleness_ms * MS
    W = watermark
    pending: list[Held] = list(held or [])
    max_ts: dict[str, int | None] = {s: None for s in p.sources}
    last_arrival = {s: batches[0][0] for s in p.sources} if batches else {}
    out: list[BatchOut] = []
    for batch_id, (t_batch, frame) in enumerate(batches, start=first_batch):
        records = frame.to_dict("records")
        res = BatchOut(watermark=None)
        # 1. §2: malformed, then invalid, then future rows go to the dead letters, before the SQL
        valid: list[Row] = []
        for r in records:
            if not missing(r.get("_malformed")) and r.get("_malformed"):
                res.dead.append(("malformed", r))
            elif missing(r["_event_ts"]):
                res.dead.append(("invalid_event_time", r))
            elif int(r["_event_ts"]) > t_batch + p.max_future_skew_ms * MS:
                res.dead.append(("future", r))
            else:
                valid.append({**r, "_event_ts": int(r["_event_ts"])})
        # 2. §2: per-source watermarks measured before the SQL; W = max(W_prev, min over non-idle sources)
        for s in p.sources:
            ts = [r["_event_ts"] for r in valid if r["_source"] == s]
            if ts and (max_ts[s] is None or max(ts) > max_ts[s]):
                max_ts[s] = max(ts)
            if any(r["_source"] == s for r in records):
                last_arrival[s] = t_batch
        active = [s for s in p.sources if not t_batch - last_arrival[s] > idleness]
        if active and all(max_ts[s] is not None for s in active):
            candidate = min(max_ts[s] - lateness for s in active)  # type: ignore[operator]
            W = candidate if W is None else max(W, candidate)
        res.watermark = W
        # 3. the SQL over the valid rows
        for r in valid:
            if query.where is not None and query.where(r) is not True:
                res.filtered.append(r)  # reason "where": the SELECT list is not evaluated on it
                continue
            try:
                selected = query.select(r)
                release = NOW if query.branches is None else release_time(r, query.branches)
            except SqlError:
                res.dead.append(("sql_error", r))
                continue
            if release is None:
                res.not_released.append(r)  # "no branch with a TRUE guard, or only branches that never release"
            else:
                pending.append(Held(release, batch_id, r["_event_ts"], selected, r))
        # 4. "WATERMARK_TS() is the pipeline watermark W after the batch's advance": a row leaves in the
        #    first batch whose W reaches its release time (the batch it arrived in included)
        due = [h for h in pending if h.release == NOW or (W is not None and h.release <= W)]
        pending = [h for h in pending if not (h.release == NOW or (W is not None and h.release <= W))]
        res.released = sorted(due, key=order_key)
        res.held = list(pending)
        out.append(res)
    return out


def upsert_table(outs: list[BatchOut], key: tuple[str, ...]) -> dict[tuple, Row]:
    """A keyed postgres target: per key the row of the latest batch; within a batch "the row with the
    largest (_event_ts, then the tuple of values in SELECT order) winning"."""
    table: dict[tuple, tuple[tuple, Row]] = {}
    for res in outs:
        winners: dict[tuple, tuple[tuple, Row]] = {}
        for h in res.released:
            k = tuple(h.row[c] for c in key)
            rank = (h.event_ts, _value_key(h.row))
            if k not in winners or rank > winners[k][0]:
                winners[k] = (rank, h.row)
        table.update(winners)
    return {k: row for k, (_, row) in table.items()}
