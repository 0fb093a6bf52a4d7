"""Watermarks (``ematix_dagster/streaming/watermark.py``; no Spark): monotone, min over sources, idleness, processing time."""

from __future__ import annotations

from ematix_dagster.streaming.watermark import Watermarks


def test_watermark_monotone_and_min_over_sources() -> None:
    wm = Watermarks(lateness=10, idleness=1_000, sources=("a", "b"))
    wm.start_run(batch_time=0)
    wm.observe("a", rows=2, max_event_ts=100, batch_time=0)
    wm.observe("b", rows=1, max_event_ts=70, batch_time=0)
    assert wm.advance(batch_time=0) == 60  # min(100, 70) - 10
    assert wm.source_watermarks() == {"a": 90, "b": 60}
    wm.observe("a", rows=1, max_event_ts=50, batch_time=5)  # older rows never lower a source
    wm.observe("b", rows=1, max_event_ts=40, batch_time=5)
    assert wm.advance(batch_time=5) == 60
    assert wm.source_watermarks() == {"a": 90, "b": 60}
    wm.observe("b", rows=1, max_event_ts=300, batch_time=10)
    assert wm.advance(batch_time=10) == 90  # now "a" is the slowest
    # W never goes back, even when the slowest active source changes
    wm2 = Watermarks(lateness=0, idleness=100, sources=("a", "b"))
    wm2.start_run(0)
    wm2.observe("a", 1, 500, 0)
    wm2.observe("b", 1, 400, 0)
    assert wm2.advance(0) == 400
    wm2.observe("b", 1, 600, 150)  # "a" idle at 150 -> W = 600
    assert wm2.advance(150) == 600
    wm2.observe("a", 1, 510, 160)  # "a" back, at 510 < 600: W stays
    assert wm2.advance(160) == 600


def test_idle_exclusion_by_batch_time() -> None:
    wm = Watermarks(lateness=0, idleness=100, sources=("a", "b"))
    wm.start_run(batch_time=1_000)
    wm.observe("a", 1, 500, 1_000)
    wm.observe("b", 1, 200, 1_000)
    assert wm.advance(1_000) == 200
    wm.observe("a", 1, 800, 1_100)
    wm.observe("b", 0, None, 1_100)
    assert not wm.is_idle("b", 1_100)  # exactly idleness since last arrival: not yet idle
    assert wm.advance(1_100) == 200
    wm.observe("a", 1, 900, 1_101)
    assert wm.is_idle("b", 1_101) and not wm.is_idle("a", 1_101)
    assert wm.advance(1_101) == 900  # b excluded
    wm.observe("b", 3, 250, 1_200)   # b is back (behind): W does not go back
    assert not wm.is_idle("b", 1_200)
    assert wm.advance(1_200) == 900
    assert wm.source_watermarks() == {"a": 900, "b": 250}


def test_never_seen_source_holds_w_until_idle() -> None:
    wm = Watermarks(lateness=5, idleness=100, sources=("a", "b"))
    wm.start_run(batch_time=50)  # first batch of the run: every source counts as just arrived
    wm.observe("a", 4, 1_000, 50)
    wm.observe("b", 0, None, 50)
    assert wm.advance(50) is None
    wm.observe("a", 1, 1_100, 150)
    assert wm.advance(150) is None     # 150 - 50 = 100: b not idle yet
    wm.observe("a", 1, 1_200, 151)
    assert wm.advance(151) == 1_195    # b idle now; a's watermark alone
    assert wm.source_watermarks() == {"a": 1_195, "b": None}


def test_all_sources_idle_w_stays() -> None:
    wm = Watermarks(lateness=0, idleness=10, sources=("a", "b"))
    wm.start_run(0)
    wm.observe("a", 1, 100, 0)
    wm.observe("b", 1, 80, 0)
    assert wm.advance(0) == 80
    assert wm.advance(11) == 80  # both idle: stays
    assert wm.is_idle("a", 11) and wm.is_idle("b", 11)
    assert wm.advance(10_000) == 80
    # nothing ever seen and everything idle: still no watermark
    wm2 = Watermarks(lateness=0, idleness=10, sources=("a",))
    wm2.start_run(0)
    assert wm2.advance(100) is None


def test_restart_resets_last_arrival() -> None:
    wm = Watermarks(lateness=0, idleness=10, sources=("a", "b"))
    wm.start_run(0)
    wm.observe("a", 1, 100, 0)
    wm.observe("b", 1, 50, 0)
    assert wm.advance(0) == 50
    wm.observe("a", 1, 200, 100)
    assert wm.advance(100) == 200  # b idle
    wm.start_run(1_000)           # restart: b counts as just arrived again
    wm.observe("a", 1, 300, 1_000)
    assert not wm.is_idle("b", 1_000)
    assert wm.advance(1_000) == 200  # b (wm 50) holds W; W never goes back


def test_processing_time_mode() -> None:
    wm = Watermarks(lateness=7, idleness=10, sources=("a",), processing_time=True)
    wm.start_run(100)
    wm.observe("a", 1, 10**9, 100)  # event times do not matter
    assert wm.advance(100) == 93
    assert wm.advance(500) == 493
    assert wm.advance(400) == 493  # monotone even if a batch time went back
    wm.raise_to(1_000)
    assert wm.global_wm == 1_000
    wm.raise_to(10)
    assert wm.global_wm == 1_000
