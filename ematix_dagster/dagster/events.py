"""The runner's per-batch reports as Dagster events (dagster-sling's event-iterator seam).

Batches that wrote rows become materializations, batches that only consumed rows observations,
throttled; heartbeat-only batches give no event and no log line (a summary line every
``summary_seconds`` counts them). The stream ends with a ``MaterializeResult`` holding the run's
totals as ``run_*``, so they never join the per-batch series.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator, Iterable, Iterator, Mapping, Optional

import dagster as dg

from ematix_dagster.dagster.versions import batch_data_version
from ematix_dagster.spark.batch.batch_report import BatchReport, RowCounts
from ematix_dagster.streaming.kinds import format_us

DEFAULT_THROTTLE_SECONDS = 10.0
DEFAULT_SUMMARY_SECONDS = 300.0
#: the metadata entry holding the store's counters after an event's last batch
STORE_COUNTERS = "store_counters"


def _seconds(us: Optional[int]) -> Optional[float]:
    return None if us is None else us / 1e6


def rows_written(report: Any) -> int:
    """Rows a batch (or a stretch of them) wrote to the target: finals, corrections, early rows (an
    emit trigger fired) and retractions, or a row pipeline's released rows."""
    return int(report.rows_written)


def _wrote_rows(report: Any) -> bool:
    return rows_written(report) > 0


def is_heartbeat_only(report: Any) -> bool:
    """A batch that read no rows and emitted nothing (e.g. only the heartbeat ticked)."""
    return (report.rows_in == 0 and not _wrote_rows(report) and report.count("late_rows") == 0
            and report.dead_letter_rows == 0)


@dataclass
class _Window:
    """What happened over a stretch of batches (since the previous event, summary, or the start)."""

    batches: int = 0
    idle_batches: int = 0
    rows_in: int = 0
    windows_emitted: int = 0
    corrections: int = 0
    early_rows: int = 0
    retractions: int = 0
    late_rows: int = 0
    dead_letter_rows: int = 0
    filtered_rows: int = 0
    #: a row pipeline's rows written (None: a windowed pipeline's batches)
    released_rows: Optional[int] = None
    rows_by_source: dict[str, int] = field(default_factory=dict)
    first_batch_id: Optional[int] = None

    @property
    def rows_written(self) -> int:
        return self.windows_emitted + self.corrections + self.early_rows + self.retractions + (self.released_rows or 0)

    def add(self, report: BatchReport) -> None:
        if self.first_batch_id is None:
            self.first_batch_id = int(report.batch_id)
        self.batches += 1
        self.idle_batches += int(is_heartbeat_only(report))
        self.rows_in += report.rows_in
        self.windows_emitted += report.count("windows_emitted")
        self.corrections += report.count("corrections")
        self.early_rows += report.count("early_rows")
        self.retractions += report.count("retractions")
        self.late_rows += report.count("late_rows")
        self.dead_letter_rows += report.dead_letter_rows
        self.filtered_rows += report.filtered_rows
        if isinstance(report.counts, RowCounts):
            self.released_rows = (self.released_rows or 0) + report.counts.released_rows
        for name, n in report.rows_by_source.items():
            self.rows_by_source[name] = self.rows_by_source.get(name, 0) + n


def position_metadata(report: Any, now_s: float) -> dict[str, Any]:
    """Where the stream stands after ``report``: batch, state size, watermarks (timestamps) and the lag."""
    meta: dict[str, Any] = {
        "batch_id": int(report.batch_id),
        "state_groups": report.count("state_groups"),
        "windows_open": report.count("windows_open"),
        "batch_seconds": float(report.seconds),
        "idle_sources": len(report.idle_sources),
    }
    if isinstance(report.counts, RowCounts):  # a row pipeline: rows held back by WATERMARK_TS()
        meta["held_rows"] = int(report.counts.held_rows)
    watermark = _seconds(report.watermark)
    if watermark is not None:
        meta["watermark"] = dg.MetadataValue.timestamp(watermark)
        meta["watermark_lag_seconds"] = float(now_s - watermark)  # numeric: the Plots tab draws it
    for name, wm in sorted(report.source_watermarks.items()):
        if wm is not None:
            meta[f"watermark/{name}"] = dg.MetadataValue.timestamp(wm / 1e6)
    if report.totals:  # where the next run's account of unreported batches starts (dagster/unreported.py)
        meta[STORE_COUNTERS] = dg.MetadataValue.json(dict(sorted(report.totals.items())))
    return meta


def batch_metadata(report: Any, since: _Window, elapsed_s: float, now_s: float) -> dict[str, Any]:
    """One per-batch event: counts of the batches with data since the previous event, then the position."""
    meta: dict[str, Any] = {
        "batches": since.batches,
        "rows_in": since.rows_in,
        "rows_per_second": float(since.rows_in / elapsed_s) if elapsed_s > 0 else 0.0,
        "windows_emitted": since.windows_emitted,
        "corrections": since.corrections,
        "early_rows": since.early_rows,
        "retractions": since.retractions,
        "late_rows": since.late_rows,
        "dead_letter_rows": since.dead_letter_rows,
        "filtered_rows": since.filtered_rows,
    }
    if since.released_rows is not None:
        meta["released_rows"] = since.released_rows
    if _wrote_rows(since):  # what these batches wrote; the table's size is dagster/row_count (lineage.py)
        meta["rows_written"] = rows_written(since)
    for name, n in sorted(since.rows_by_source.items()):
        meta[f"rows_in/{name}"] = n
    meta.update(position_metadata(report, now_s))
    return meta


def run_metadata(totals: _Window, elapsed_s: float) -> dict[str, Any]:
    """The run's totals, under names of their own (``run_*``) so they never join the per-batch series."""
    meta: dict[str, Any] = {
        "run_batches": totals.batches,
        "run_idle_batches": totals.idle_batches,
        "run_rows_in": totals.rows_in,
        "run_windows_emitted": totals.windows_emitted,
        "run_corrections": totals.corrections,
        "run_early_rows": totals.early_rows,
        "run_retractions": totals.retractions,
        "run_late_rows": totals.late_rows,
        "run_dead_letter_rows": totals.dead_letter_rows,
        "run_filtered_rows": totals.filtered_rows,
        "run_rows_per_second": float(totals.rows_in / elapsed_s) if elapsed_s > 0 else 0.0,
        "run_seconds": float(elapsed_s),
    }
    if totals.released_rows is not None:
        meta["run_released_rows"] = totals.released_rows
    for name, n in sorted(totals.rows_by_source.items()):
        meta[f"run_rows_in/{name}"] = n
    return meta


def _span(window: _Window, last_batch_id: int) -> str:
    first = window.first_batch_id
    return f"batch {last_batch_id}" if first is None or first == last_batch_id else f"batches {first}-{last_batch_id}"


def _emitted(window: _Window) -> str:
    """The rows written, in words; early rows and retractions only when there are some."""
    if window.released_rows is not None:
        return f"{window.released_rows} rows written"
    extra = "".join(f", {n} {label}" for label, n in (("early rows", window.early_rows),
                                                      ("retractions", window.retractions)) if n)
    return f"{window.windows_emitted} windows emitted (+{window.corrections} corrections){extra}"


def _describe(window: _Window, report: Any) -> str:
    return (f"{_span(window, int(report.batch_id))}: {window.rows_in} rows in, {_emitted(window)}, "
            f"{window.late_rows} late rows, watermark {format_us(report.watermark)}")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


class EmatixEventIterator(Iterator[Any]):
    """Dagster events from a runner's ``BatchReport`` stream (like dagster-sling's event iterator).

    * A batch that wrote rows (finals, corrections, early rows or retractions) gives an
      ``AssetMaterialization``; a batch that only consumed rows gives an ``AssetObservation``;
      heartbeat-only batches give nothing.
    * At most one event per ``throttle_seconds`` (by ``clock``); the counts of the batches with
      data in between are added to the next event, which comes at the next batch (heartbeat-only
      or not) once the throttle allows.
    * With ``log`` and ``summary_seconds > 0``: one summary line per ``summary_seconds`` (all
      batches since the previous line, heartbeat-only ones counted, rows, windows, position).
    * Ends with a ``MaterializeResult`` (:meth:`final_result`) when the reports end: the run's totals
      as ``run_*``, the position, and the counts of data batches not yet reported, if any.
    * ``provenance(report)`` gives a materialization's tags: code, data and input versions
      (:mod:`ematix_dagster.dagster.versions`); the final result's data version is the last batch's.
      ``metadata()`` is added to every materialization (the output's column schema).
    * ``after_report(report, event)`` gives events to yield after each batch's report and its event
      (None: the batch gave none), and after the final result (``report`` None): the asset's check
      results (:class:`~ematix_dagster.dagster.check_reports.StepChecks`).
    * ``catch_up()`` is called once, when the first report arrives (or before the final result
      when none does), and its event, if any, is yielded first: the batches an earlier run
      committed and never reported (:mod:`ematix_dagster.dagster.unreported`).
    """

    def __init__(self, reports: Iterable[Any], asset_key: dg.AssetKey, *,
                 throttle_seconds: float = DEFAULT_THROTTLE_SECONDS, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 final_metadata: Optional[Callable[[], Mapping[str, Any]]] = None,
                 summary_seconds: float = DEFAULT_SUMMARY_SECONDS, log: Optional[Callable[[str], None]] = None,
                 name: Optional[str] = None,
                 provenance: Optional[Callable[[Any], Mapping[str, str]]] = None,
                 metadata: Optional[Callable[[], Mapping[str, Any]]] = None,
                 after_report: Optional[Callable[[Any, Any], Iterable[Any]]] = None,
                 catch_up: Optional[Callable[[], Optional[Any]]] = None) -> None:
        self.asset_key = asset_key
        self.name = name or asset_key.to_user_string()
        self.throttle_seconds = max(0.0, float(throttle_seconds))
        self.summary_seconds = max(0.0, float(summary_seconds))
        self._clock = clock
        self._wall = wall_clock
        self._final_metadata = final_metadata
        self._log = log
        self._provenance = provenance
        self._metadata = metadata
        self._after_report = after_report
        self._catch_up = catch_up
        self.totals = _Window()
        self.events_yielded = 0
        self.summaries_logged = 0
        self.last_report: Any = None
        self._started = clock()
        self._since = _Window()
        self._since_started = self._started
        self._last_data: Any = None
        self._reports = reports
        self._inner = self._events(iter(reports))

    def __iter__(self) -> "EmatixEventIterator":
        return self

    def __next__(self) -> Any:
        return next(self._inner)

    def close(self) -> None:
        """Close this iterator and the report stream under it (a runner stops and releases its lease)."""
        self._inner.close()
        close = getattr(self._reports, "close", None)
        if close is not None:
            close()

    def _events(self, reports: Iterator[Any]) -> Generator[Any, None, None]:
        last_event_at: Optional[float] = None
        summary = _Window()
        summary_started = self._started
        for report in reports:
            yield from self._caught_up()
            self.last_report = report
            self.totals.add(report)
            summary.add(report)
            now = self._clock()
            if self._log is not None and self.summary_seconds and now - summary_started >= self.summary_seconds:
                self._log(self._summary_line(summary, now - summary_started, report))
                self.summaries_logged += 1
                summary, summary_started = _Window(), now
            event = None
            if not is_heartbeat_only(report):
                self._since.add(report)
                self._last_data = report
            # a heartbeat-only batch has no event of its own; but data batches held back by the
            # throttle are reported once the throttle allows, not only with the next batch that has data
            if self._since.batches and (last_event_at is None or now - last_event_at >= self.throttle_seconds):
                event = self._event(now)
                yield event
                last_event_at = now
            if self._after_report is not None:
                yield from self._after_report(report, event)
        yield from self._caught_up()
        final = self.final_result()
        yield final
        if self._after_report is not None:
            yield from self._after_report(None, final)

    def _caught_up(self) -> Iterator[Any]:
        catch_up, self._catch_up = self._catch_up, None
        event = catch_up() if catch_up is not None else None
        if event is not None:
            self.events_yielded += 1
            yield event

    def _event(self, now: float) -> Any:
        """The event for the data batches since the previous one (at the last of them)."""
        since, report = self._since, self._last_data
        meta = batch_metadata(report, since, now - self._since_started, self._wall())
        if _wrote_rows(since):
            tags = dict(self._provenance(report)) if self._provenance is not None else None
            if self._metadata is not None:
                meta.update(self._metadata())
            event: Any = dg.AssetMaterialization(asset_key=self.asset_key, metadata=meta, tags=tags,
                                                 description=_describe(since, report))
        else:
            event = dg.AssetObservation(asset_key=self.asset_key, metadata=meta,
                                        description=_describe(since, report) + " (nothing emitted)")
        self.events_yielded += 1
        self._since_started = now
        self._since = _Window()
        return event

    def _summary_line(self, window: _Window, seconds: float, report: Any) -> str:
        lag = ""
        if report.watermark is not None:
            lag = f" (lag {self._wall() - report.watermark / 1e6:.0f} s)"
        return (f"[{self.name}] last {_duration(seconds)}: {window.batches} batches ({window.idle_batches} "
                f"heartbeat-only), {window.rows_in} rows in, {_emitted(window)}, {window.late_rows} late rows; "
                f"at batch {report.batch_id}, "
                f"watermark {format_us(report.watermark)}{lag}, {report.count('state_groups')} state groups")

    def final_result(self, stopped: Optional[str] = None) -> dg.MaterializeResult:
        """The closing ``MaterializeResult`` (also built after a terminate, when the reports did not end)."""
        now = self._clock()
        meta: dict[str, Any] = {}
        r = self.last_report
        if r is not None:
            if self._since.batches:  # data batches the throttle held back: reported here, under per-batch names
                meta.update(batch_metadata(self._last_data, self._since, now - self._since_started, self._wall()))
            meta.update(position_metadata(r, self._wall()))
        meta.update(run_metadata(self.totals, now - self._started))
        if stopped:
            meta["stopped"] = dg.MetadataValue.text(stopped)
        if self._metadata is not None:
            meta.update(self._metadata())
        if self._final_metadata is not None:
            meta.update(self._final_metadata())
        return dg.MaterializeResult(metadata=meta, data_version=None if r is None else batch_data_version(r))


__all__ = ["DEFAULT_SUMMARY_SECONDS", "DEFAULT_THROTTLE_SECONDS", "EmatixEventIterator", "batch_metadata",
           "is_heartbeat_only", "position_metadata", "rows_written", "run_metadata"]
