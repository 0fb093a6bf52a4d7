"""Session windows on the driver (docs/contract/windows.md) against an independent pandas ground truth.

The oracle (tests/streaming/session_oracle.py) imports nothing from the engine: each batch it applies the late rule
against the previous watermark, recomputes every key's sessions from all accepted rows so far (per key and cap
bucket, a new session when consecutive rows are more than ``gap`` apart), emits the sessions whose
end is before W as ``final``, re-emits emitted sessions that took rows in the batch as
``correction`` and retracts target rows whose (start, key) no longer exists. The engine side is fed
what Spark will send: each batch's accepted rows sessionized per (key, cap bucket) into partials,
merged with the real aggregator classes. No Spark is started.
"""

from __future__ import annotations

import copy
import doctest
import hashlib
import random
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

import ematix_dagster.streaming.kinds.sessions.session_rules as session_module
from ematix_dagster.columns import RETRACT
from ematix_dagster.errors import StateCapExceeded
from ematix_dagster.spec.window import SessionSpec
from ematix_dagster.streaming.aggregators import Aggregator, Avg, Count, ExactDistinct, First, Last, Max, Min, Sum
from ematix_dagster.streaming.emission import emit
from ematix_dagster.streaming.emitted import EmittedRow
from ematix_dagster.streaming.kinds.kind_state import StoredColumns, StoredGroup
from ematix_dagster.streaming.kinds.sessions.session_rules import SessionWindows, session_id, session_ids
from ematix_dagster.streaming.kinds.sessions.session_state import SessionState
from tests.streaming.session_oracle import ALIASES, Key, Oracle, Out, Params, Partials, Row, canon, partials_of
from tests.streaming.store_changes import StoreChanges, take_changes


class Harness:
    """Runs SessionState batch by batch the way the engine will, and keeps a simulated store."""

    def __init__(self, p: Params, seed: int = 0) -> None:
        self.p, self.rng = p, random.Random(seed)
        self.rules = SessionWindows(p.gap, p.cap)

        def aggs() -> list[Aggregator]:
            return [Count(), Count(), Sum(True), Min(), Max(), First(), Last(), ExactDistinct(10_000), Avg()]

        self.fresh = lambda: SessionState("p", aggs(), ALIASES, p.max_groups, self.rules)
        self.state = self.fresh()
        self.max_seen: int | None = None
        self.store: dict[tuple[int, Key], tuple[int, list[Any], bool, Any]] = {}
        self.target: dict[tuple[int, Key], tuple[int, tuple[Any, ...]]] = {}
        self.late, self.kinds, self.outputs = 0, set(), []  # rows judged late, kinds seen, output per batch

    def batch(self, rows: list[Row]) -> tuple[list[Out], list[Out]]:
        p = self.p
        closed_before = None if self.max_seen is None else self.max_seen - p.lateness - p.retention
        accepted = [r for r in rows if self.rules.row_windows(r[1], closed_before)]
        self.late += len(rows) - len(accepted)
        merge(self.state, partials_of(accepted, p, self.rng))
        self.max_seen = max([t for _, t, _ in rows] + [m for m in (self.max_seen,) if m is not None], default=None)
        w = None if self.max_seen is None else self.max_seen - p.lateness
        retractions, out = split(emit(self.state, None, w, p.retention).rows)
        self.commit()
        for r in retractions:
            del self.target[(r.start, r.key)]
        for r in out:
            self.target[(r.start, r.key)] = (r.end, r.values)
        self.kinds.update(r.kind for r in retractions + out)
        self.outputs.append((canon(retractions), canon(out)))
        return self.outputs[-1]

    def commit(self) -> None:
        """Apply the state's changes like a store (deletes, then upserts); it must mirror the state exactly
        and write only sessions that differ from what the store holds."""
        changes = take_changes(self.state)
        upserts, deletes = changes.upserts, changes.deletes
        for start, key in deletes:
            del self.store[(start, key)]
        written = self.state.written
        for start, end, key, accs, emitted in upserts:
            row = (end, copy.deepcopy(accs), emitted, written.get(start, {}).get(key))
            assert self.store.get((start, key)) != row, f"unchanged session {start} {key} rewritten"
            self.store[(start, key)] = row
        held = {(s.start, key): (s.end, s.accs, s.emitted, written.get(s.start, {}).get(key))
                for key, ss in self.state.sessions.items() for s in ss}
        assert self.store == held
        assert sum(map(len, written.values())) == sum(row[3] is not None for row in held.values())

    def restart(self) -> None:
        """A restart: a new SessionState from the store's rows."""
        self.state = self.fresh()
        self.state.restore(StoredColumns.from_rows(StoredGroup(start, end, key, copy.deepcopy(accs), emitted)
                                                   for (start, key), (end, accs, emitted, _) in self.store.items()), None)
        for (start, key), (_, _, _, written) in self.store.items():
            if written is not None:
                self.state.written.setdefault(start, {})[key] = written


def merge(state: SessionState, partials: Partials) -> None:
    """``partials`` (as Spark forms them) merged as the engine merges them."""
    keys, firsts, lasts, columns = partials
    state.merge(firsts, keys, columns, lasts)


def split(rows: list[EmittedRow]) -> tuple[list[EmittedRow], list[EmittedRow]]:
    """A batch's rows as (retractions, the rest); the retractions must come first (docs/contract/emission.md)."""
    retractions = [r for r in rows if r.kind == RETRACT]
    assert rows[:len(retractions)] == retractions, "a retraction after a row it may retract"
    return retractions, rows[len(retractions):]


def run_both(p: Params, batches: list[list[Row]], restart_after: int | None = None, seed: int = 0) -> Harness:
    """Feed both sides batch by batch and require identical output in every batch."""
    oracle, harness = Oracle(p), Harness(p, seed)
    for i, rows in enumerate(batches):
        assert harness.batch(rows) == oracle.batch(rows), f"batch {i}, seed {seed}, {p}"
        if restart_after == i:
            harness.restart()
    assert harness.target == oracle.target
    return harness


A, Z = ("a",), ("z",)


def vals(*vs: int) -> tuple[Any, ...]:
    """The expected values of a session whose rows carry ``vs`` in event-time order (no NULLs)."""
    return (len(vs), len(vs), sum(vs), min(vs), max(vs), vs[0], vs[-1], len(set(vs)), sum(vs) / len(vs))


def test_session_rules_spec_late_rule_bounds_and_estimate() -> None:
    result = doctest.testmod(session_module, optionflags=doctest.ELLIPSIS)  # tests/test_doctests.py skips subpackages
    assert result.attempted >= 8 and result.failed == 0
    spec = SimpleNamespace(gap_ms=30_000, max_session_duration_ms=3_600_000)
    rules = SessionWindows.for_window(spec)  # type: ignore[arg-type]
    assert (rules.gap, rules.cap) == (30_000_000, 3_600_000_000)
    assert SessionSpec.fingerprint(spec) == {  # type: ignore[arg-type]
        "window.gap_ms": 30_000, "window.max_session_duration_ms": 3_600_000}
    with pytest.raises(ValueError):
        SessionWindows(gap=10, cap=10)
    rules = SessionWindows(gap=10, cap=100)
    assert rules.bucket(-1) == -1 and rules.bucket(99) == 0 and rules.bucket(100) == 1
    assert rules.session_end(89, 0) == 99 and rules.session_end(90, 0) == 100 and rules.session_end(95, 0) == 100
    assert rules.row_windows(50, closed_before=50) != [] and rules.row_windows(49, closed_before=50) == []
    assert rules.row_windows(49, closed_before=None) != []
    assert rules.expected_open_windows(lateness=0, retention=0) == 3
    assert rules.expected_open_windows(lateness=40, retention=50) == 13
    assert not hasattr(rules, "bounds")  # no start alone names a session's window
    assert rules.valid_end(0, 10) and rules.valid_end(95, 100) and not rules.valid_end(95, 101)
    assert rules.describe_at(0) == "session starting 1970-01-01T00:00:00Z"


def test_session_id_is_sha256_of_msgpack_pipeline_key_start() -> None:
    key = b"\x01\x92\xa1a\xc0"  # encode_key(("a", None)): format byte 1 + msgpack ["a", nil]
    # msgpack by hand: fixarray(3), fixstr "pipe", bin8 of the key, uint16 start
    packed = b"\x93\xa4pipe\xc4\x05" + key + b"\xcd\x01\x2c"
    assert msgpack.packb(["pipe", key, 300], use_bin_type=True) == packed
    expected = int.from_bytes(hashlib.sha256(packed).digest()[:8], "big", signed=True)
    assert session_id("pipe", key, 300) == expected == -5191747666912893704
    assert session_id("pipe", key, 301) != expected and session_id("pipf", key, 300) != expected


def test_session_ids_of_a_batch_are_each_rows_own() -> None:
    """A batch's ids are laid out a column at a time: keys whose msgpack header is bin 8 or bin 16,
    starts in every int format (before the epoch too), each as msgpack and SHA-256 give it."""
    keys = [b"\x01\x91" + bytes([n % 256]) * n for n in (0, 1, 253, 254, 255, 256, 300, 70000)]
    starts = [0, 127, 128, -1, -33, 65536, 2**32, -(2**40), 1_700_000_000_000_000]
    rows = [(k, t) for k in keys for t in starts]
    expected = [int.from_bytes(hashlib.sha256(msgpack.packb(["pipe", k, t], use_bin_type=True)).digest()[:8], "big",
                               signed=True) for k, t in rows]
    assert session_ids("pipe", [k for k, _ in rows], [t for _, t in rows]) == expected
    assert session_ids("pipe", [], []) == []


# -- scenarios with exact values -------------------------------------------------------------------

def test_rows_exactly_gap_apart_join_and_gap_plus_one_splits() -> None:
    h = run_both(Params(), [[(A, 0, 1), (A, 10, 2)], [(A, 20, 3), (A, 31, 4)], [(Z, 200, 9)]])
    assert h.outputs == [([], []), ([], [("final", 0, 30, A, vals(1, 2, 3))]), ([], [("final", 31, 41, A, vals(4))])]


def test_sessions_are_cut_at_cap_bucket_boundaries() -> None:
    h = Harness(Params())
    h.batch([(A, 85, 1), (A, 95, 2)])
    assert [(s.start, s.end) for s in h.state.sessions[A]] == [(85, 100)]  # end capped at the bucket end
    with pytest.raises(ValueError, match="one cap bucket"):
        h.state.merge([190], [A], [[1]] * len(ALIASES), [210])
    h = run_both(Params(), [[(A, 85, 1), (A, 95, 2)], [(A, 100, 3), (A, 105, 4)], [(Z, 300, 0)]])
    # 95 -> 100 is within gap, but in the next bucket; W = 105 closes the capped session
    assert h.outputs == [([], []), ([], [("final", 85, 100, A, vals(1, 2))]),
                         ([], [("final", 100, 115, A, vals(3, 4))])]


@pytest.mark.parametrize("policy", ["drop", "dlq"])
def test_late_row_is_not_merged_under_drop(policy: str) -> None:
    h = run_both(Params(policy=policy), [[(A, 0, 1), (A, 50, 2)], [(A, 5, 7), (A, 55, 3)], [(Z, 100, 0)]])
    # 5 < W_prev = 50 is late; 55 extends [50, 60)
    assert h.outputs == [([], [("final", 0, 10, A, vals(1))]), ([], []), ([], [("final", 50, 65, A, vals(2, 3))])]
    assert h.late == 1 and h.target == {(0, A): (10, vals(1)), (50, A): (65, vals(2, 3))}


def test_late_row_under_reopen_bridges_two_sessions() -> None:
    p = Params(policy="reopen", allowed=100)
    h = run_both(p, [[(A, 0, 1), (A, 20, 2), (Z, 100, 0)], [(A, 10, 5)], [(Z, 250, 0)]])
    assert h.outputs == [
        ([], [("final", 0, 10, A, vals(1)), ("final", 20, 30, A, vals(2))]),
        ([("retract", 20, 30, A, vals(2))], [("correction", 0, 30, A, (3, 3, 8, 1, 5, 1, 2, 3, 8 / 3))]),
        ([], [("final", 100, 110, Z, vals(0))]),
    ]
    assert A not in h.state.sessions  # 30 + 100 < 250: evicted
    assert h.batch([(A, 15, 6)]) == ([], []) and h.late == 1  # 15 < 250 - 100: beyond the allowance
    assert h.target == {(0, A): (30, (3, 3, 8, 1, 5, 1, 2, 3, 8 / 3)), (100, Z): (110, vals(0))}


@pytest.mark.parametrize("late, merged", [
    ([(A, 7, 5), (A, 22, 6)], (5, 5, 16, 0, 6, 0, 3, 5, 16 / 5)),  # two partials, each bridging two
    ([(A, 5, 5), (A, 12, 6), (A, 20, 7), (A, 27, 8)], (7, 7, 31, 0, 8, 0, 3, 7, 31 / 7)),  # one partial over all
])
def test_late_rows_under_reopen_bridge_three_sessions(late: list[Row], merged: tuple[Any, ...]) -> None:
    h = run_both(Params(policy="reopen", allowed=100), [[(A, 0, 0), (A, 15, 2), (A, 30, 3), (Z, 100, 0)], late])
    assert [r[1] for r in h.outputs[0][1]] == [0, 15, 30]
    assert h.outputs[1] == ([("retract", 15, 25, A, vals(2)), ("retract", 30, 40, A, vals(3))],
                            [("correction", 0, 40, A, merged)])
    assert h.state.open_windows(None) == 1 and h.state.window_count == 2  # z's [100, 110) is still open


def test_late_row_moving_a_start_retracts_the_old_start_and_bridging_an_open_session() -> None:
    p = Params(policy="reopen", allowed=100)
    h = run_both(p, [[(A, 20, 2), (A, 38, 4), (Z, 40, 0)], [(A, 12, 1)], [(A, 29, 3)], [(Z, 500, 0)]])
    assert h.outputs == [
        ([], [("final", 20, 30, A, vals(2))]),  # W = 40: [38, 48) stays open
        ([("retract", 20, 30, A, vals(2))], [("correction", 12, 30, A, vals(1, 2))]),
        ([], [("correction", 12, 48, A, vals(1, 2, 3, 4))]),  # 29 bridges [12, 30) and the open [38, 48)
        ([], [("final", 40, 50, Z, vals(0))]),  # the merged session is not final again
    ]


def test_null_key_values_are_groups_of_their_own() -> None:
    keys = [(None, 1), (None, None), ("a", None), ("a", 1)]
    rows = [(k, t + i, v) for t in (0, 5, 30) for i, k in enumerate(keys) for v in (t, None)]
    batches = [rows[:10], rows[10:] + [((None, None), 200, None)]]
    h = run_both(p := Params(), batches)
    # key i has rows at i, 5 + i and 30 + i (one NULL value each): sessions [i, 5 + i] and [30 + i]
    assert sorted(h.target, key=repr) == sorted([(i + t, k) for i, k in enumerate(keys) for t in (0, 30)], key=repr)
    assert h.target[(1, (None, None))] == (16, (4, 2, 5, 0, 5, 0, 5, 2, 2.5))
    assert h.target[(31, (None, None))] == (41, (2, 1, 30, 30, 30, 30, 30, 1, 30.0))
    assert h.target[(0, (None, 1))] == (15, (4, 2, 5, 0, 5, 0, 5, 2, 2.5))
    assert Harness(p).batch([((None, None), 0, None), ((None, None), 50, None)]) == (
        [], [("final", 0, 10, (None, None), (1, 0, None, None, None, None, None, 0, None))])


def test_group_cap_counts_keys_holding_sessions() -> None:
    h = Harness(Params(max_groups=2))
    h.batch([(A, 0, 1), (("b",), 50, 2)])  # a's session is final and evicted at W = 50
    assert h.state.group_count == 1
    h.batch([(("c",), 55, 3)])
    with pytest.raises(StateCapExceeded, match=r"max_groups_per_window=2.*\('d',\).*pipeline p"):
        h.batch([(("d",), 56, 4), (("c",), 57, 5)])
    assert sorted(h.state.sessions) == [("b",), ("c",)] and h.state.sessions[("c",)][0].accs[0] == 1


def test_a_session_kept_by_its_retention_to_the_microsecond_keeps_its_written_row() -> None:
    """A final row is remembered unless this emission's eviction drops its session (end + retention
    < W): a session whose end + retention is exactly W stays, and its row is retracted when a late
    row moves its start."""
    state = SessionState("p", [Count()], ["n"], 10, SessionWindows(gap=10, cap=100))
    state.merge([10], [A], [[2]], lasts=[10])  # [10, 20)
    rows = emit(state, None, 35, retention=15).rows  # 20 + 15 == 35: final, kept
    assert [(r.kind, r.start, r.end) for r in rows] == [("final", 10, 20)] and state.written == {10: {A: (20, (2,))}}
    state.merge([2], [A], [[1]], lasts=[2])  # late, under reopen: the session now starts at 2
    rows = emit(state, 35, 35, retention=15).rows
    assert [(r.kind, r.start, r.end, r.values) for r in rows] == [("retract", 10, 20, (2,)), ("correction", 2, 20, (3,))]


def test_take_changes_and_two_merges_before_one_emit() -> None:
    h = Harness(Params(policy="reopen", allowed=100))
    h.batch([(A, 20, 2), (A, 40, 4), (Z, 100, 0)])  # store: a@20, a@40, z@100
    state = h.state
    merge(state, partials_of([(A, 25, 5)], h.p, h.rng))  # [20, 25]
    merge(state, partials_of([(A, 33, 3), (A, 12, 1)], h.p, h.rng))  # [12, 40]: start moved, bridged
    changes = take_changes(state)
    upserts, deletes = changes.upserts, changes.deletes
    assert [(u[0], u[1], u[2], u[4]) for u in upserts] == [(12, 50, A, True)] and upserts[0][3][0] == 5
    assert sorted(deletes) == [(20, A), (40, A)] and take_changes(state) == StoreChanges()
    retractions, out = split(emit(state, None, 100, retention=100).rows)  # retractions repeat the rows as emitted
    assert (canon(retractions), canon(out)) == (
        [("retract", 20, 30, A, vals(2)), ("retract", 40, 50, A, vals(4))],
        [("correction", 12, 50, A, vals(1, 2, 5, 3, 4))])
    emit(state, None, 200, retention=100)  # 50 + 100 < 200: evicted; z [100, 110) final, kept
    changes = take_changes(state)
    upserts, deletes = changes.upserts, changes.deletes
    assert deletes == [(12, A)] and [(u[0], u[2], u[4]) for u in upserts] == [(100, Z, True)]


# -- randomised: against the oracle, with restarts; split invariance without late rows -------------

RANDOM_KEYS: list[Key] = [("a",), ("b",), (None,), ("c",)]


def random_rows(rng: random.Random, n: int, disorder: int, keys: list[Key] = RANDOM_KEYS) -> list[Row]:
    """Rows in arrival order: event times increase by 0..9 with up to ``disorder`` of jitter."""
    rows, t = [], 0
    for _ in range(n):
        t += rng.randint(0, 9)
        rows.append((rng.choice(keys), t + rng.randint(-disorder, 0), rng.choice([None, *range(-5, 6)])))
    return rows


def random_split(rng: random.Random, rows: list[Row], batches: int) -> list[list[Row]]:
    cuts = sorted(rng.sample(range(1, len(rows)), batches - 1))
    return [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)])]


def test_random_late_data_matches_the_oracle() -> None:
    kinds: set[str] = set()
    for seed in range(16):
        rng = random.Random(seed)
        p = Params(gap=rng.choice([5, 10, 20]), cap=rng.choice([40, 100]), lateness=rng.choice([0, 10]),
                   policy=rng.choice(["drop", "reopen"]), allowed=rng.choice([30, 80]))
        batches = random_split(rng, random_rows(rng, 300, disorder=60), 12)
        kinds |= run_both(p, batches, restart_after=rng.randrange(12), seed=seed).kinds
    assert kinds == {"final", "correction", "retract"}


#: keys that are their own ids (``IntKeys``): small, negative, past what a (key, time) pair holds, int64's ends
INT_KEYS: list[Key] = [(7,), (-3,), (10**15,), (2**63 - 1,), (-(2**63),)]


@pytest.mark.parametrize("later", [None, (None,)], ids=["ints throughout", "then a NULL"])
def test_integer_keys_match_the_oracle_and_move_to_an_index_when_a_null_comes(later: Key | None) -> None:
    """Sessions of one-integer keys hold no key objects; a later batch bringing a NULL key (which
    no int64 id stands for) moves every held session to a key index mid-stream. Both match the
    oracle, across a restart."""
    for seed in range(4):
        rng = random.Random(seed)
        p = Params(gap=10, cap=100, lateness=10, policy=rng.choice(["drop", "reopen"]), allowed=80)
        rows = random_rows(rng, 300, disorder=60, keys=INT_KEYS)
        if later is not None:
            rows[200:] = [(later if rng.random() < 0.3 else key, t, v) for key, t, v in rows[200:]]
        batches = random_split(rng, rows, 12)
        harness = run_both(p, batches, restart_after=rng.randrange(12), seed=seed)
        assert type(harness.state.codes).__name__ == ("IntKeys" if later is None else "KeyIndex")


@pytest.mark.parametrize("seed", range(6))
def test_split_invariance_without_late_rows(seed: int) -> None:
    rng = random.Random(100 + seed)
    p = Params(gap=rng.choice([5, 10]), cap=rng.choice([40, 100]), lateness=15, policy=rng.choice(["drop", "reopen"]),
               allowed=30)
    rows = random_rows(rng, 400, disorder=14)  # disorder < lateness: no row is late under any split
    whole = Oracle(p)
    whole.batch(rows)
    assert len(whole.target) > 20
    for n in (2, 5, 17, 60):
        split = random_split(rng, rows, n)
        h = run_both(p, split, seed=seed)
        assert h.late == 0 and h.target == whole.target, f"{n} batches"
