"""Ground truth for emission triggers and retractions (docs/contract/when-results-leave.md on top of
windows.md, late-data.md and emission.md): plain Python, batch by batch.

It imports nothing from ``ematix_dagster``: the window starts, the NULL-aware group key and the
aggregates are those of the fixed-window oracle (``tests/oracle.py``); sessions are formed here,
with plain lists (not the pandas sessionizer of ``tests/streaming/session_oracle.py``, which imports an
engine type). One source, every row valid (no invalid or future event times, no idleness).

State is kept as the engine's contract describes it, per *unit* = (window, group): the ids of the
accepted rows it holds (aggregates are recomputed from the rows at every write), whether it was
*emitted* (a ``final`` or ``correction`` of it, or of a session merged into it, was written), whether
it changed since the interval timer last fired; beside it the target's current row per key
(window_start, group) and the interval timer.

Per batch (W_prev = W before it, None = -inf):

1. the late rule against W_prev: fixed windows take a row in every assignment whose end > W_prev
   (under ``reopen``: end + allowed_lateness > W_prev); a session takes a row unless t < W_prev
   (under ``reopen``: t < W_prev - allowed_lateness). Late rows still move the watermark;
2. W = max(W_prev, newest event time - lateness);
3. every unit gets at most one non-retract row: ``final`` if it closes in this batch (fixed:
   W_prev < end <= W; session: end < W) and was not emitted; else ``correction`` if it changed and
   was emitted (fixed windows: or had already closed, end <= W_prev: a group's first rows reaching
   a closed window); else ``early`` if it is open (fixed: end > W; session: end >= W), was never
   emitted and the trigger fires for it;
4. ``retract`` rows repeat the target's current row of a key: for every session key that
   disappeared (start moved, merged), and with ``retractions`` for every key a new row supersedes;
5. units are evicted once end + allowed_lateness <= W (sessions: < W; allowed_lateness 0 unless
   ``reopen``).

Rows of one batch (or of the flush) come retracts first, then the others, each ordered by
(window_start, group key) with NULL keys first. ``end_of_input = "flush"`` writes, after the last
batch, a ``final`` for every open unit never emitted (with ``retractions``, after a retract of its
``early`` row).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable

from tests.oracle import MS, _aggregate, _key, window_starts

Row = dict[str, Any]
Key = tuple[Any, ...]  # (window_start, *group values): the target key


@dataclass(frozen=True)
class Config:
    kind: str = "tumbling"  # tumbling | hopping | session
    duration_ms: int | None = None  # tumbling, hopping
    hop_ms: int | None = None  # hopping
    gap_ms: int | None = None  # session
    max_session_duration_ms: int | None = None  # session
    lateness_ms: int = 0
    late_data: str = "drop"  # drop | reopen
    allowed_lateness_ms: int = 0  # reopen only
    #: "watermark" | "every_batch" | {"interval_ms": N} | {"count": N}, as in the TOML
    emit_trigger: str | dict[str, int] = "watermark"
    retractions: bool = False
    group_by: tuple[str, ...] = ("k",)
    #: (agg, column, alias) as tests/oracle.py computes them (count, count_col, sum, exact count_distinct)
    aggregations: tuple[tuple[str, str | None, str], ...] = (("count", None, "n"), ("sum", "v", "total"))
    end_of_input: str = "keep"  # keep | flush

    @property
    def retention_us(self) -> int:
        return self.allowed_lateness_ms * MS if self.late_data == "reopen" else 0


@dataclass
class Unit:
    """One (window, group) held in state."""

    start: int
    end: int
    group: Key
    rows: list[int]  # ids of the accepted rows it holds
    emitted: bool = False
    changed_since_fire: bool = False  # the interval trigger's set of groups changed since its last firing


@dataclass
class Outcome:
    batches: list[list[Row]] = field(default_factory=list)  # each batch's rows, in the contract's order
    flush: list[Row] = field(default_factory=list)  # the end-of-input flush's rows (after the last batch's)
    tables: list[dict[Key, Row]] = field(default_factory=list)  # the reader's view after each batch
    final_table: dict[Key, Row] = field(default_factory=dict)  # ... after the flush (the last table if none)
    watermarks: list[int | None] = field(default_factory=list)  # W after each batch
    fired: list[bool] = field(default_factory=list)  # the interval timer fired in the batch


def row_key(row: Row, group_by: Iterable[str]) -> Key:
    return (row["window_start"], *(row[g] for g in group_by))


def order_key(key: Key) -> tuple:
    """(window_start, group key) with NULL group values first."""
    return (key[0], tuple((v is not None, v) for v in key[1:]))


def spec_order(rows: list[Row], group_by: Iterable[str]) -> list[Row]:
    """Retracts first, then the other rows, each ordered by (window_start, group key)."""
    group_by = tuple(group_by)
    return sorted(rows, key=lambda r: (r["_emit_kind"] != "retract", order_key(row_key(r, group_by))))


def sessions_of(rows: list[tuple[int, Key, int]], gap: int, cap: int) -> list[tuple[Key, list[tuple[int, int]]]]:
    """(group, [(t, row id)] in time order) of each session: per group and cap bucket floor(t / cap),
    a run of rows whose consecutive event times are at most ``gap`` apart."""
    by_bucket: dict[tuple[Key, int], list[tuple[int, int]]] = {}
    for row_id, group, t in rows:
        by_bucket.setdefault((group, t // cap), []).append((t, row_id))
    out = []
    for (group, _), items in by_bucket.items():
        items.sort()
        run = [items[0]]
        for item in items[1:]:
            if item[0] - run[-1][0] > gap:
                out.append((group, run))
                run = []
            run.append(item)
        out.append((group, run))
    return out


class TriggerOracle:
    def __init__(self, cfg: Config) -> None:
        if cfg.kind not in ("tumbling", "hopping", "session"):
            raise ValueError(f"the trigger oracle does not implement {cfg.kind} windows")
        self.cfg = cfg
        trigger = cfg.emit_trigger
        self.trigger = trigger if isinstance(trigger, str) else next(iter(trigger))  # interval_ms | count
        self.n = None if isinstance(trigger, str) else next(iter(trigger.values()))
        self.W: int | None = None
        self.max_ts: int | None = None
        self.last_fire: int | None = None  # the interval timer: batch time of its last firing
        self.rows: dict[int, Row] = {}  # accepted rows still held, by id
        self.batch_of: dict[int, int] = {}  # row id -> the batch that brought it
        self.units: dict[Key, Unit] = {}
        self.written: dict[Key, Row] = {}  # the target's current row per key (retracted keys gone)
        self.batch_no = 0
        self.out = Outcome()

    # -- windows ----------------------------------------------------------------------------------

    def _accept(self, records: list[Row], W_prev: int | None) -> None:
        cfg, retention = self.cfg, self.cfg.retention_us
        for r in records:
            t = int(r["_event_ts"])
            self.max_ts = t if self.max_ts is None else max(self.max_ts, t)
            row_id = len(self.batch_of)
            self.batch_of[row_id] = self.batch_no
            group = _key(r, cfg.group_by)
            if cfg.kind == "session":
                if W_prev is None or t >= W_prev - retention:
                    self.rows[row_id] = {**r, "_event_ts": t}
                continue
            duration = cfg.duration_ms * MS
            hop = (cfg.hop_ms or cfg.duration_ms) * MS
            starts = [s for s in window_starts(t, duration, hop) if W_prev is None or s + duration + retention > W_prev]
            if starts:
                self.rows[row_id] = {**r, "_event_ts": t}
            for s in starts:
                unit = self.units.setdefault((s, *group), Unit(s, s + duration, group, []))
                unit.rows.append(row_id)

    def _sessions(self) -> dict[Key, tuple[Unit, list[Unit]]]:
        """Every session of the held rows, with the units of the previous batch it contains."""
        cfg = self.cfg
        gap, cap = cfg.gap_ms * MS, cfg.max_session_duration_ms * MS
        unit_of = {row_id: unit for unit in self.units.values() for row_id in unit.rows}
        out = {}
        held = [(row_id, _key(r, cfg.group_by), r["_event_ts"]) for row_id, r in self.rows.items()]
        for group, run in sessions_of(held, gap, cap):
            start, last = run[0][0], run[-1][0]
            unit = Unit(start, min(last + gap, (start // cap + 1) * cap), group, [i for _, i in run])
            parts = list({id(u): u for u in (unit_of[i] for _, i in run if i in unit_of)}.values())
            out[(start, *group)] = (unit, parts)
        return out

    # -- one batch ----------------------------------------------------------------------------------

    def _fires(self, unit: Unit, parts: list[Unit], changed: bool, timer: bool) -> bool:
        if self.trigger == "every_batch":
            return changed
        if self.trigger == "count":
            before = sum(len(p.rows) for p in parts)  # a merged session starts from the sum of its parts
            return len(unit.rows) // self.n > before // self.n
        if self.trigger == "interval_ms":
            return timer and (changed or any(p.changed_since_fire for p in parts))
        return False  # watermark: finals and corrections only

    def _row(self, unit: Unit, kind: str) -> Row:
        mine = [self.rows[i] for i in unit.rows]
        return {"window_start": unit.start, "window_end": unit.end, **dict(zip(self.cfg.group_by, unit.group)),
                **_aggregate(mine, self.cfg.aggregations), "_emit_kind": kind}

    def _write(self, new_rows: dict[Key, Row], vanished: Iterable[Key]) -> list[Row]:
        """The batch's rows in the contract's order: retracts of vanished keys (and, with retractions, of
        superseded ones), then the new rows; the target's current rows follow."""
        retract = set(vanished)
        if self.cfg.retractions:
            retract |= {k for k in new_rows if k in self.written}
        out = [{**self.written[k], "_emit_kind": "retract"} for k in retract if k in self.written]
        for k in retract:
            self.written.pop(k, None)
        self.written.update(new_rows)
        return spec_order(out + list(new_rows.values()), self.cfg.group_by)

    def batch(self, time_us: int, records: list[Row]) -> list[Row]:
        cfg, W_prev = self.cfg, self.W
        before = {k: dataclasses.replace(u, rows=list(u.rows)) for k, u in self.units.items()}  # as they were
        self._accept(records, W_prev)
        if self.max_ts is not None:
            candidate = self.max_ts - cfg.lateness_ms * MS
            self.W = candidate if W_prev is None else max(W_prev, candidate)
        W = self.W
        timer = self.trigger == "interval_ms" and (self.last_fire is None or time_us >= self.last_fire + self.n * MS)
        session = cfg.kind == "session"
        if session:
            current = self._sessions()
        else:
            current = {k: (u, [before[k]] if k in before else []) for k, u in self.units.items()}

        new_rows: dict[Key, Row] = {}
        units: dict[Key, Unit] = {}
        for key, (unit, parts) in current.items():
            changed = any(self.batch_of[i] == self.batch_no for i in unit.rows)
            emitted = any(p.emitted for p in parts)
            if session:
                closes, already_closed, open_ = end_lt(unit.end, W), False, not end_lt(unit.end, W)
            else:
                already_closed = W_prev is not None and unit.end <= W_prev
                closes = not already_closed and W is not None and unit.end <= W
                open_ = W is None or unit.end > W
            kind = None
            if closes and not emitted:
                kind = "final"
            elif changed and (emitted or already_closed):
                kind = "correction"
            elif open_ and not emitted and self._fires(unit, parts, changed, timer):
                kind = "early"
            if kind is not None:
                new_rows[key] = self._row(unit, kind)
            unit.emitted = emitted or kind in ("final", "correction")
            unit.changed_since_fire = not timer and (changed or any(p.changed_since_fire for p in parts))
            units[key] = unit
        vanished = [k for k in self.units if k not in units] if session else []
        out = self._write(new_rows, vanished)

        # eviction: end + allowed_lateness <= W (sessions: < W)
        retention = cfg.retention_us
        self.units = {k: u for k, u in units.items()
                      if not (W is not None and (u.end + retention < W if session else u.end + retention <= W))}
        held = {i for u in self.units.values() for i in u.rows}
        self.rows = {i: r for i, r in self.rows.items() if i in held}
        if timer:
            self.last_fire = time_us
        self.batch_no += 1
        self.out.batches.append(out)
        self.out.tables.append(dict(self.written))
        self.out.watermarks.append(W)
        self.out.fired.append(timer)
        return out

    def flush(self) -> list[Row]:
        """``end_of_input = "flush"``: a ``final`` for every open unit never emitted."""
        W = self.W
        finals = {}
        for key, unit in self.units.items():
            open_ = W is None or (not end_lt(unit.end, W) if self.cfg.kind == "session" else unit.end > W)
            if open_ and not unit.emitted:
                finals[key] = self._row(unit, "final")
                unit.emitted = True
        out = self._write(finals, [])
        self.out.flush = out
        return out


def end_lt(end: int, W: int | None) -> bool:
    """A session closes once window_end < W (docs/contract/windows.md#session-windows)."""
    return W is not None and end < W


def run(batches: list[tuple[int, list[Row]]], cfg: Config) -> Outcome:
    """Every batch (batch time µs, rows with ``_event_ts`` µs and the group / value columns), then the
    flush when ``cfg.end_of_input`` is ``"flush"`` and there was a batch."""
    oracle = TriggerOracle(cfg)
    for time_us, records in batches:
        oracle.batch(time_us, records)
    if cfg.end_of_input == "flush" and batches:
        oracle.flush()
    oracle.out.final_table = dict(oracle.written)
    return oracle.out
