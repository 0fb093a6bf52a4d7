"""The trigger oracle (tests/e2e/trigger_oracle.py) on small examples worked out by hand, no Spark.

Times are seconds; every expected row is written out from the contract
(docs/contract/windows.md, late-data.md, emission.md, when-results-leave.md) in the comments, not
computed. A row is (kind, window_start, window_end, k, n, total) with n = count(*), total = sum(v).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests.e2e.trigger_oracle import Config, run, spec_order

S = 1_000_000


def ev(t: float, k: str | None, v: int | None = 1) -> dict:
    return {"_event_ts": int(t * S), "k": k, "v": v}


def feed(cfg: Config, batches: list[tuple[float, list[dict]]]):
    return run([(int(t * S), rows) for t, rows in batches], cfg)


def rows(out: list[dict]) -> list[tuple]:
    return [(r["_emit_kind"], r["window_start"] // S, r["window_end"] // S, r["k"], r["n"], r["total"]) for r in out]


TUMBLING = Config(kind="tumbling", duration_ms=10_000, emit_trigger="every_batch", end_of_input="flush")


def tumbling_batches():
    return [(100, [ev(1, "a", 1), ev(2, "a", 2), ev(3, "b", 3)]),  # W = 3: [0, 10) open
            (101, [ev(5, "a", 4), ev(12, "c", 5)]),  # W = 12: [0, 10) closes
            (102, [ev(8, "b", 6), ev(13, "c", 7)])]  # b@8 is late (end 10 <= W_prev 12): dropped; W = 13


def test_every_batch_tumbling_then_final_and_flush() -> None:
    out = feed(TUMBLING, tumbling_batches())
    assert [rows(b) for b in out.batches] == [
        [("early", 0, 10, "a", 2, 3), ("early", 0, 10, "b", 1, 3)],
        # b did not change, but its window closes: every group of it gets its final
        [("final", 0, 10, "a", 3, 7), ("final", 0, 10, "b", 1, 3), ("early", 10, 20, "c", 1, 5)],
        [("early", 10, 20, "c", 2, 12)],
    ]
    assert rows(out.flush) == [("final", 10, 20, "c", 2, 12)]  # the early of the last batch, then its final
    assert out.watermarks == [3 * S, 12 * S, 13 * S]
    assert {k[1]: r["_emit_kind"] for k, r in out.final_table.items()} == {"a": "final", "b": "final", "c": "final"}


def test_with_retractions_every_superseding_row_follows_a_retract_of_the_row_it_replaces() -> None:
    out = feed(Config(**{**TUMBLING.__dict__, "retractions": True}), tumbling_batches())
    assert [rows(b) for b in out.batches] == [
        [("early", 0, 10, "a", 2, 3), ("early", 0, 10, "b", 1, 3)],
        [("retract", 0, 10, "a", 2, 3), ("retract", 0, 10, "b", 1, 3),  # retracts first, in key order
         ("final", 0, 10, "a", 3, 7), ("final", 0, 10, "b", 1, 3), ("early", 10, 20, "c", 1, 5)],
        [("retract", 10, 20, "c", 1, 5), ("early", 10, 20, "c", 2, 12)],
    ]
    assert rows(out.flush) == [("retract", 10, 20, "c", 2, 12), ("final", 10, 20, "c", 2, 12)]


def test_null_keys_sort_first() -> None:
    out = feed(Config(kind="tumbling", duration_ms=10_000, emit_trigger="every_batch", retractions=True),
               [(1, [ev(1, "b"), ev(2, None, 5), ev(3, "a")]), (2, [ev(4, "a"), ev(5, None, None)])])
    assert rows(out.batches[0]) == [("early", 0, 10, None, 1, 5), ("early", 0, 10, "a", 1, 1),
                                    ("early", 0, 10, "b", 1, 1)]
    # sum skips the NULL v; count(*) counts the row
    assert rows(out.batches[1]) == [("retract", 0, 10, None, 1, 5), ("retract", 0, 10, "a", 1, 1),
                                    ("early", 0, 10, None, 2, 5), ("early", 0, 10, "a", 2, 2)]


def test_count_fires_when_floor_rows_over_n_grows() -> None:
    out = feed(Config(kind="tumbling", duration_ms=10_000, emit_trigger={"count": 2}),
               [(1, [ev(1, "a")]),  # 1 row: floor(1/2) = 0
                (2, [ev(2, "a"), ev(3, "a")]),  # 3 rows: floor 1 > 0
                (3, [ev(4, "a")]),  # 4: floor 2 > 1
                (4, [ev(5, "a")]),  # 5: floor 2, no growth
                (5, [ev(11, "a")])])  # W = 11: [0, 10) final; [10, 20) holds 1 row
    assert [rows(b) for b in out.batches] == [
        [], [("early", 0, 10, "a", 3, 3)], [("early", 0, 10, "a", 4, 4)], [], [("final", 0, 10, "a", 5, 5)]]
    assert out.flush == [] and out.final_table.keys() == {(0, "a")}  # end_of_input = keep: [10, 20) waits


def test_interval_one_timer_restarting_from_each_firing() -> None:
    # interval 10 s; batch times 100 (first batch: fires), 104 (< 110), 111 (fires, timer 111),
    # 115 (< 121), 130 (fires, timer 130), 141 (fires with nothing changed, timer 141), 150 (< 151)
    out = feed(Config(kind="tumbling", duration_ms=100_000, emit_trigger={"interval_ms": 10_000}),
               [(100, [ev(1, "a")]), (104, [ev(2, "b")]), (111, [ev(3, "a")]), (115, [ev(4, "c")]),
                (130, []), (141, []), (150, [ev(5, "a")])])
    assert out.fired == [True, False, True, False, True, True, False]
    assert [rows(b) for b in out.batches] == [
        [("early", 0, 100, "a", 1, 1)],
        [],
        # a changed in this batch, b in the batch before: both changed since the last firing
        [("early", 0, 100, "a", 2, 2), ("early", 0, 100, "b", 1, 1)],
        [],
        [("early", 0, 100, "c", 1, 1)],  # c changed at 115, nothing changed at 130
        [],  # fires, nothing changed; had the timer not restarted at 141, 150 >= 130 + 10 would fire
        [],
    ]


def test_session_start_moves_under_drop_and_its_early_row_is_retracted() -> None:
    cfg = Config(kind="session", gap_ms=10_000, max_session_duration_ms=1_000_000, lateness_ms=5_000,
                 emit_trigger="every_batch", end_of_input="flush")
    batches = [(1, [ev(100, "a")]),  # W = 95; session [100, 110)
               (2, [ev(97, "a")]),  # 97 >= W_prev = 95: accepted, the start moves to 97; W stays 95
               (3, [ev(115, "a")]),  # W = 110; 115 is 15 s after 100: a new session [115, 125)
               (4, [ev(130, "a")])]  # W = 125: [97, 110) closes (110 < 125); [115, 125) does not (125 < 125 is false)
    out = feed(cfg, batches)
    assert [rows(b) for b in out.batches] == [
        [("early", 100, 110, "a", 1, 1)],
        [("retract", 100, 110, "a", 1, 1), ("early", 97, 110, "a", 2, 2)],  # the key (100, a) disappeared
        [("early", 115, 125, "a", 1, 1)],  # [97, 110) did not change: every_batch does not fire for it
        [("final", 97, 110, "a", 2, 2), ("early", 130, 140, "a", 1, 1)],
    ]
    assert rows(out.flush) == [("final", 115, 125, "a", 1, 1), ("final", 130, 140, "a", 1, 1)]
    assert sorted(k[0] // S for k in out.final_table) == [97, 115, 130]

    out = feed(Config(**{**cfg.__dict__, "retractions": True}), batches)
    assert rows(out.batches[1]) == [("retract", 100, 110, "a", 1, 1), ("early", 97, 110, "a", 2, 2)]
    assert rows(out.batches[3]) == [("retract", 97, 110, "a", 2, 2), ("final", 97, 110, "a", 2, 2),
                                    ("early", 130, 140, "a", 1, 1)]
    assert rows(out.flush) == [("retract", 115, 125, "a", 1, 1), ("retract", 130, 140, "a", 1, 1),
                               ("final", 115, 125, "a", 1, 1), ("final", 130, 140, "a", 1, 1)]


SESSION_REOPEN = Config(kind="session", gap_ms=10_000, max_session_duration_ms=1_000_000, late_data="reopen",
                        allowed_lateness_ms=100_000, emit_trigger={"count": 2})


def test_a_late_row_merges_an_emitted_session_with_an_early_one() -> None:
    batches = [(1, [ev(0, "a", 1), ev(15, "a", 2), ev(16, "a", 3)]),  # W = 16: [0, 10) final; [15, 26): 2 rows
               (2, [ev(8, "a", 4)])]  # late (8 < 16) within the allowance: bridges both into [0, 26)
    out = feed(SESSION_REOPEN, batches)
    assert [rows(b) for b in out.batches] == [
        [("final", 0, 10, "a", 1, 1), ("early", 15, 26, "a", 2, 5)],
        # the merged session contains an emitted one: a correction; the key (15, a) disappeared
        [("retract", 15, 26, "a", 2, 5), ("correction", 0, 26, "a", 4, 10)],
    ]
    out = feed(Config(**{**SESSION_REOPEN.__dict__, "retractions": True}), batches)
    assert rows(out.batches[1]) == [("retract", 0, 10, "a", 1, 1), ("retract", 15, 26, "a", 2, 5),
                                    ("correction", 0, 26, "a", 4, 10)]
    assert {k[0]: r["n"] for k, r in out.tables[1].items()} == {0: 4}


def test_count_of_a_merged_session_starts_from_the_sum_of_its_parts() -> None:
    cfg = Config(kind="session", gap_ms=10_000, max_session_duration_ms=1_000_000, lateness_ms=50_000,
                 emit_trigger={"count": 3})
    out = feed(cfg, [(1, [ev(100, "b"), ev(101, "b"), ev(115, "b"), ev(116, "b")]),  # 2 + 2 rows, W = 66
                     (2, [ev(108, "b")]),  # bridges: 5 rows from 2 + 2 = 4: floor(5/3) = floor(4/3), no row
                     (3, [ev(109, "b")])])  # 6 rows: floor 2 > 1
    assert [rows(b) for b in out.batches] == [[], [], [("early", 100, 126, "b", 6, 6)]]


def test_hopping_reopen_a_first_row_in_a_closed_window_is_a_correction() -> None:
    cfg = Config(kind="hopping", duration_ms=20_000, hop_ms=10_000, late_data="reopen", allowed_lateness_ms=20_000,
                 emit_trigger="every_batch")
    batches = [(1, [ev(5, "a", 1)]),  # windows -10 and 0; W = 5
               (2, [ev(12, "a", 2)]),  # windows 0 and 10; W = 12: [-10, 10) closes
               (3, [ev(8, "b", 3)]),  # late: [-10, 10) closed (retained: 10 + 20 > 12), [0, 20) open
               (4, [ev(31, "a", 4)]),  # W = 31: [0, 20) and [10, 30) close; [-10, 10) evicted (10 + 20 <= 31)
               (5, [ev(9, "b", 5)])]  # [-10, 10) gone (10 + 20 <= 31); [0, 20) retained: a correction
    expected = [
        [("early", -10, 10, "a", 1, 1), ("early", 0, 20, "a", 1, 1)],
        [("final", -10, 10, "a", 1, 1), ("early", 0, 20, "a", 2, 3), ("early", 10, 30, "a", 1, 2)],
        [("correction", -10, 10, "b", 1, 3), ("early", 0, 20, "b", 1, 3)],  # no final before it
        [("final", 0, 20, "a", 2, 3), ("final", 0, 20, "b", 1, 3), ("final", 10, 30, "a", 1, 2),
         ("early", 20, 40, "a", 1, 4), ("early", 30, 50, "a", 1, 4)],
        [("correction", 0, 20, "b", 2, 8)],
    ]
    assert [rows(b) for b in feed(cfg, batches).batches] == expected
    with_retracts = feed(Config(**{**cfg.__dict__, "retractions": True}), batches).batches
    assert rows(with_retracts[4]) == [("retract", 0, 20, "b", 1, 3), ("correction", 0, 20, "b", 2, 8)]
    # the watermark trigger: the same finals and corrections, no early rows; retracts only before corrections
    plain = feed(Config(**{**cfg.__dict__, "emit_trigger": "watermark", "retractions": True}), batches).batches
    assert [rows(b) for b in plain] == [[r for r in b if r[0] != "early"] for b in expected[:4]] + [
        [("retract", 0, 20, "b", 1, 3), ("correction", 0, 20, "b", 2, 8)]]


def test_spec_order() -> None:
    out = spec_order([{"window_start": 1, "k": "a", "_emit_kind": "early"},
                      {"window_start": 2, "k": None, "_emit_kind": "retract"},
                      {"window_start": 1, "k": None, "_emit_kind": "final"},
                      {"window_start": 0, "k": "b", "_emit_kind": "early"}], ["k"])
    assert [(r["window_start"], r["k"]) for r in out] == [(2, None), (0, "b"), (1, None), (1, "a")]


# -- invariants of emission triggers on random inputs (the oracle against itself) -------------------

CONFIGS = [Config(kind=kind, duration_ms=None if kind == "session" else 20_000,
                  hop_ms=10_000 if kind == "hopping" else None,
                  gap_ms=8_000 if kind == "session" else None,
                  max_session_duration_ms=60_000 if kind == "session" else None,
                  lateness_ms=5_000, late_data=policy, allowed_lateness_ms=30_000 if policy == "reopen" else 0,
                  emit_trigger=trigger, retractions=retractions, end_of_input="flush")
           for kind in ("tumbling", "hopping", "session") for policy in ("drop", "reopen")
           for trigger in ("watermark", "every_batch", {"interval_ms": 3_000}, {"count": 2})
           for retractions in (False, True)]


@pytest.mark.parametrize("seed", range(3))
def test_random_inputs_keep_the_section_10_invariants(seed: int) -> None:
    rng = random.Random(seed)
    kinds: Counter[str] = Counter()
    for cfg in CONFIGS:
        t, batches = 0.0, []
        for b in range(8):
            t += rng.choice([1, 2, 4])
            batches.append((1000 + b * 2, [ev(max(0.0, t - rng.choice([0, 0, 3, 9, 20])), rng.choice(["a", "b", None]),
                                              rng.randint(1, 9)) for _ in range(rng.randint(1, 4))]))
        out = feed(cfg, batches)
        finals: Counter[tuple] = Counter()
        closed: set[tuple] = set()  # keys written as final or correction
        signed: Counter[tuple] = Counter()
        for n, batch in enumerate([*out.batches, out.flush]):
            keys = [(r["window_start"], r["k"]) for r in batch if r["_emit_kind"] != "retract"]
            assert len(keys) == len(set(keys)), "at most one non-retract row per key per batch"
            assert spec_order(batch, ["k"]) == batch
            for r in batch:
                key, kind = (r["window_start"], r["k"]), r["_emit_kind"]
                kinds[kind] += 1
                assert not (kind == "early" and key in closed), "never an early after a final or correction"
                finals[key] += kind == "final"
                closed |= {key} if kind in ("final", "correction") else set()
                body = tuple(sorted((c, v) for c, v in r.items() if c != "_emit_kind"))
                signed[body] += -1 if kind == "retract" else 1
            table = out.tables[n] if n < len(out.batches) else out.final_table
            if cfg.retractions:
                current = {tuple(sorted((c, v) for c, v in r.items() if c != "_emit_kind")) for r in table.values()}
                assert {b for b, c in signed.items() if c} == current and set(signed.values()) <= {0, 1}
            if cfg.kind != "session" and not cfg.retractions:
                assert all(r["_emit_kind"] != "retract" for r in batch), "fixed windows retract only with retractions"
        assert max(finals.values(), default=0) <= 1
    assert all(kinds[k] > 0 for k in ("early", "final", "correction", "retract"))
