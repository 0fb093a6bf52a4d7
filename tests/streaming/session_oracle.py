"""The session-window oracle and Spark's session partials, for tests/streaming/kinds/sessions/test_session_state.py and the e2e tests.

The oracle imports nothing from the engine: each batch it applies the late rule against the
previous watermark, recomputes every key's sessions from all accepted rows so far (per key and cap
bucket, a new session when consecutive rows are more than ``gap`` apart), emits the sessions whose
end is before W as ``final``, re-emits emitted sessions that took rows in the batch as
``correction`` and retracts target rows whose (start, key) no longer exists. ``partials_of`` forms
what Spark will send: each batch's accepted rows sessionized per (key, cap bucket) into partials.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ematix_dagster.streaming.emitted import EmittedRow

Key = tuple[Any, ...]
Row = tuple[Key, int, Any]  # (group key, event time µs, value or None)
Out = tuple[str, int, int, Key, tuple[Any, ...]]  # (kind, start, end, key, values)
Partials = tuple[list[Key], list[int], list[int], list[list[Any]]]  # keys, firsts, lasts, partial columns

# n = count(*), n_v = count(v), then sum, min, max, first, last, exact distinct and avg of v
ALIASES = ["n", "n_v", "sum_v", "min_v", "max_v", "first_v", "last_v", "distinct_v", "avg_v"]


@dataclass(frozen=True)
class Params:
    gap: int = 10
    cap: int = 100
    lateness: int = 0
    policy: str = "drop"  # "drop" | "dlq" | "reopen"
    allowed: int = 0  # allowed_lateness (reopen only)
    max_groups: int = 1_000

    @property
    def retention(self) -> int:
        return self.allowed if self.policy == "reopen" else 0


def sessionize(rows: list[Row], gap: int, cap: int) -> list[tuple[Key, list[int], list[Any]]]:
    """(key, event times, values) of each gap-session per key and cap bucket (oracle and Spark stand-in)."""
    if not rows:
        return []
    key_ids: dict[Key, int] = {}
    keys = [key_ids.setdefault(r[0], len(key_ids)) for r in rows]
    df = pd.DataFrame({"kid": keys, "ts": [r[1] for r in rows], "v": pd.Series([r[2] for r in rows], dtype=object)})
    df["bucket"] = df["ts"] // cap
    df = df.sort_values(["kid", "bucket", "ts"], kind="stable").reset_index(drop=True)
    starts = (df["kid"] != df["kid"].shift()) | (df["bucket"] != df["bucket"].shift()) | (df["ts"].diff() > gap)
    # the rows are sorted by (key, bucket, time): each session is the run from its start to the next one's
    bounds = [*starts.to_numpy().nonzero()[0].tolist(), len(df)]
    by_id = list(key_ids)  # ids are insertion order
    kids, ts, vs = df["kid"].tolist(), df["ts"].tolist(), df["v"].tolist()
    return [(by_id[kids[a]], ts[a:b], vs[a:b]) for a, b in zip(bounds, bounds[1:])]


# -- the oracle: docs/contract/windows.md applied batch by batch, from scratch -----------------------------------

def oracle_values(ts: list[int], vs: list[Any]) -> tuple[Any, ...]:
    vals = [v for v in vs if v is not None]
    pairs = [(t, v) for t, v in zip(ts, vs) if v is not None]
    return (len(ts), len(vals), sum(vals) if vals else None, min(vals, default=None), max(vals, default=None),
            min(pairs)[1] if pairs else None, max(pairs)[1] if pairs else None, len(set(vals)),
            sum(map(float, vals)) / len(vals) if vals else None)


FROM_EVENTS = object()  # Oracle.batch's default watermark: the newest event time less the lateness


class Oracle:
    def __init__(self, p: Params) -> None:
        self.p, self.batches = p, 0
        self.max_seen: int | None = None
        self.w: int | None = None  # the watermark after the last batch
        self.reopened = 0  # accepted rows behind the previous watermark (reopen's allowance)
        self.accepted: list[tuple[Key, int, Any, int]] = []  # (key, ts, v, batch number)
        self.emitted_rows: set[int] = set()  # indices (in ``accepted``) of rows of emitted sessions
        self.target: dict[tuple[int, Key], tuple[int, tuple[Any, ...]]] = {}

    def batch(self, rows: list[Row], watermark: Any = FROM_EVENTS) -> tuple[list[Out], list[Out]]:
        """``watermark``: W after the batch, where it is not the newest event time less the lateness
        (several sources, idleness: ``tests/oracle.py`` computes it)."""
        p, n = self.p, self.batches
        self.batches += 1
        w_prev = self.w
        for key, t, v in rows:
            if w_prev is None or t >= w_prev - (p.allowed if p.policy == "reopen" else 0):
                self.accepted.append((key, t, v, n))
                self.reopened += w_prev is not None and t < w_prev  # let in by the allowance
        self.max_seen = max([t for _, t, _ in rows] + [m for m in (self.max_seen,) if m is not None], default=None)
        if watermark is FROM_EVENTS:
            watermark = None if self.max_seen is None else self.max_seen - p.lateness
        w = self.w = watermark
        # sessions of all accepted rows, each value tagged with its row's index in ``accepted``
        tagged = [(key, t, (v, i)) for i, (key, t, v, _) in enumerate(self.accepted)]
        out: list[Out] = []
        current: set[tuple[int, Key]] = set()
        for key, ts, tagged_vs in sessionize(tagged, p.gap, p.cap):
            members = [i for _, i in tagged_vs]
            vs = [v for v, _ in tagged_vs]
            start, last = ts[0], ts[-1]
            end = min(last + p.gap, (start // p.cap + 1) * p.cap)
            current.add((start, key))
            was_emitted = any(m in self.emitted_rows for m in members)
            changed = any(self.accepted[i][3] == n for i in members)
            values = oracle_values(ts, vs)
            if was_emitted and changed:
                out.append(("correction", start, end, key, values))
            elif not was_emitted and w is not None and end < w:
                out.append(("final", start, end, key, values))
            else:
                continue
            self.emitted_rows.update(members)
        retracts = [("retract", start, end, key, values) for (start, key), (end, values) in self.target.items()
                    if (start, key) not in current]
        for _, start, _, key, _ in retracts:
            del self.target[(start, key)]
        for _, start, end, key, values in out:
            self.target[(start, key)] = (end, values)
        return canon(retracts), canon(out)


def canon(rows: list[Out] | list[EmittedRow]) -> list[Out]:
    """Rows as (kind, start, end, key, values), in one order (keys holding None do not sort)."""
    plain = [(r.kind, r.start, r.end, r.key, r.values) if isinstance(r, EmittedRow) else r for r in rows]
    return sorted(plain, key=lambda r: (r[1], repr(r[3]), r[0]))


# -- the engine side: late rule, partials as Spark forms them, SessionState, a simulated store -----

def partials_of(rows: list[Row], p: Params, rng: random.Random) -> Partials:
    """Batch-local session partials per (key, bucket), in an arbitrary order (as Spark returns them)."""
    parts = []
    for key, ts, vs in sessionize(rows, p.gap, p.cap):
        vals = [v for v in vs if v is not None]
        pairs = [(t, v) for t, v in zip(ts, vs) if v is not None]
        parts.append((key, ts[0], ts[-1], [
            len(ts), len(vals), sum(vals) if vals else None, min(vals, default=None), max(vals, default=None),
            min(pairs) if pairs else None, max(pairs) if pairs else None, sorted(set(vals)),
            (float(sum(vals)) if vals else None, len(vals)),
        ]))
    rng.shuffle(parts)
    columns = [[part[3][i] for part in parts] for i in range(len(ALIASES))]
    return [q[0] for q in parts], [q[1] for q in parts], [q[2] for q in parts], columns
