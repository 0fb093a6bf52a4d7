"""``BackfillRange``: whole partitions only, the window starts inside, the input they need, and the
refusal while the streaming state still holds the range (docs/contract/backfill.md)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from ematix_dagster.backfill.range import BackfillRange
from ematix_dagster.errors import BackfillRefused
from ematix_dagster.spec import Aggregation, Window, load_pipeline_str
from ematix_dagster.spec.backfill import Backfill
from tests.pipeline_toml import postgres_target, windowed_pipeline_toml

HOUR, MINUTE = 3_600_000_000, 60_000_000
DAY = 24 * HOUR
JAN_1 = int(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * 1_000_000


def window(kind: str = "tumbling", duration_min: int = 60, hop_min: int | None = None, **extra) -> Window:
    return Window(kind=kind, duration_ms=duration_min * 60_000, hop_ms=None if hop_min is None else hop_min * 60_000,
                  max_groups_per_window=10, aggregations=(Aggregation("count", "n"),), **extra)


def test_a_range_is_whole_partitions_from_the_first_one_on():
    daily = Backfill("daily", "2024-01-01")
    assert BackfillRange.parse(daily, "2024-01-02", "2024-01-04T00:00:00Z") == BackfillRange(JAN_1 + DAY, JAN_1 + 3 * DAY)
    hourly = Backfill("hourly", "2024-01-01T06:00:00+00:00")
    assert BackfillRange.parse(hourly, "2024-01-01T07:00", "2024-01-01T08:00").partitions(hourly) == 1
    refusals = [
        (daily, "2024-01-02T01:00", "2024-01-03", "--from: 2024-01-02T01:00:00Z is not the start of a day"),
        (daily, "2024-01-02", "2024-01-02T12:00", "--to: 2024-01-02T12:00:00Z is not the start of a day"),
        (daily, "2024-01-03", "2024-01-02", "range [2024-01-03T00:00:00Z, 2024-01-02T00:00:00Z) is empty"),
        (daily, "2024-01-02", "2024-01-02", "is empty"),
        (daily, "2023-12-31", "2024-01-02", "before [backfill] start = 2024-01-01T00:00:00Z"),
        (hourly, "2024-01-01T05:00", "2024-01-01T07:00", "before [backfill] start = 2024-01-01T06:00:00Z"),
        (hourly, "2024-01-01T07:30", "2024-01-01T09:00", "not the start of an hour"),
    ]
    for backfill, start, end, message in refusals:
        with pytest.raises(BackfillRefused, match=message.replace("[", r"\[").replace(")", r"\)")):
            BackfillRange.parse(backfill, start, end)


@pytest.mark.parametrize("w, first, last, lo, hi", [
    # tumbling hours: the day's 24 windows, reading exactly the day
    (window(), 0, 23 * 60, 0, 24 * 60),
    # hopping 10 min every 5: the last window starts at 23:55 and reads 10 minutes into the next day
    (window("hopping", 10, 5), 0, 23 * 60 + 55, 0, 24 * 60 + 5),
    # tumbling 7 min: starts at multiples of 7 min since the epoch, not at the day's start
    (window(duration_min=7), 1, 24 * 60 - 4, 1, 24 * 60 + 3),
])
def test_the_windows_starting_in_a_day_and_the_input_they_read(w, first, last, lo, hi):
    """Independent: window starts are the multiples of the hop (since the epoch) inside the range."""
    rng = BackfillRange(JAN_1, JAN_1 + DAY)
    hop = w.hop * 1_000
    starts = [s for s in range(0, JAN_1 + 2 * DAY, hop) if JAN_1 <= s < JAN_1 + DAY]
    assert (rng.first_start(w), rng.last_start(w)) == (starts[0], starts[-1]) == (JAN_1 + first * MINUTE,
                                                                                    JAN_1 + last * MINUTE)
    assert rng.input_us(w) == (JAN_1 + lo * MINUTE, JAN_1 + hi * MINUTE) == (starts[0], starts[-1] + w.duration_ms * 1000)
    assert rng.has_windows(w)


def test_an_hour_may_hold_no_window_start():
    assert not BackfillRange(JAN_1 + HOUR, JAN_1 + 2 * HOUR).has_windows(window(duration_min=24 * 60))


def _spec(**window_keys):
    return load_pipeline_str(windowed_pipeline_toml(
        "bf", Path("/tmp/bf"), duration_ms=3_600_000, target=postgres_target("postgresql://x@h/db", "public.t"),
        extra={"backfill": {"partition": "daily", "start": "2024-01-01"}}, **window_keys))


def test_a_range_the_streaming_state_still_holds_is_refused():
    """Closed once the stored watermark reaches the last window's end plus its allowed lateness."""
    rng = BackfillRange(JAN_1, JAN_1 + DAY)
    drop, reopen = _spec(), _spec(late_data="reopen", allowed_lateness_ms=600_000)
    rng.refuse_unless_closed(drop, JAN_1 + DAY)  # the last window [23:00, 24:00) is final at W = 24:00
    with pytest.raises(BackfillRefused, match="still holds windows .* last window ends at 2024-01-02T00:00:00Z"):
        rng.refuse_unless_closed(drop, JAN_1 + DAY - 1)
    rng.refuse_unless_closed(reopen, JAN_1 + DAY + 10 * MINUTE)
    with pytest.raises(BackfillRefused, match="held until 2024-01-02T00:10:00Z, and the stored watermark is "
                                              "2024-01-02T00:09:59"):
        rng.refuse_unless_closed(reopen, JAN_1 + DAY + 10 * MINUTE - 1_000_000)
    with pytest.raises(BackfillRefused, match="holds no watermark"):
        rng.refuse_unless_closed(drop, None)
