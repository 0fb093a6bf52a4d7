"""A deferrable sensor on a pipeline's output: waits, without a worker slot, until the target holds
every row of event time before ``until``.

The rule (:meth:`~.watermark.OutputPosition.complete_until`): the output watermark the pipeline
committed last (stored with each commit: the watermark held rows are released by, kept back to the
oldest row still held in the state store by ``[emit] sql`` or ``WATERMARK_TS()``) is past ``until``,
so every window ending at or before ``until`` has been written. A ``late_data = "reopen"`` pipeline
may still write corrections for those windows afterwards.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Sequence

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

from ematix_dagster.airflow.connection import DEFAULT_URL_VARIABLE, export_url
from ematix_dagster.airflow.triggers import WatermarkTrigger, read_position


def until_us(value: Any) -> int:
    """A rendered time (``{{ data_interval_end }}``: ``2026-01-01 00:00:00+00:00``, or a datetime) as µs; naive is UTC."""
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    delta = parsed - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class EmatixWatermarkSensor(BaseSensorOperator):
    """Succeed once ``pipeline``'s target is complete up to ``until`` (default: the data interval's end).

    Deferrable (unless ``deferrable=False``, which pokes in the worker slot): the first check runs in the task; while the target is behind, the task defers to
    :class:`~.triggers.WatermarkTrigger`, which polls the store every ``poke_interval`` seconds in the
    triggerer (no worker slot, no Spark) until the sensor's ``timeout``. The XCom value is the position
    it saw: batch, watermark, output watermark, whether held rows kept it back.
    """

    template_fields: Sequence[str] = ("pipeline", "until")
    ui_color = "#f4f0e8"

    def __init__(self, *, pipeline: str, until: str = "{{ data_interval_end }}", conn_id: str | None = None,
                 url_variable: str = DEFAULT_URL_VARIABLE, working_dir: str | None = None,
                 deferrable: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", 30)
        super().__init__(**kwargs)
        self.pipeline = str(pipeline)
        self.until = until
        self.conn_id = conn_id
        self.url_variable = url_variable
        self.working_dir = working_dir
        self.deferrable = deferrable

    def _path(self) -> str:
        path = Path(self.pipeline)
        if self.working_dir and not path.is_absolute():
            path = Path(self.working_dir) / path
        return str(path)

    def poke(self, context: Any) -> bool:
        """One check (``deferrable=False``: the sensor pokes in its worker slot instead of deferring)."""
        position = read_position(self._path(), {}, self.working_dir)
        at = until_us(self.until)
        self.log.info("%s; complete up to %s: %s", position.describe(at), self.until, position.complete_until(at))
        return position.complete_until(at)

    def execute(self, context: Any) -> Any:
        at = until_us(self.until)
        export_url(self.conn_id, self.url_variable)
        if not self.deferrable:
            return super().execute(context)
        try:
            position = read_position(self._path(), {}, self.working_dir)
        except Exception as exc:  # noqa: BLE001
            if getattr(exc, "terminal", True):
                raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc
            self.log.warning("%s; deferring", exc)
        else:
            if position.complete_until(at):
                self.log.info("%s: complete up to %s", position.describe(), self.until)
                return position.as_dict()
            self.log.info("%s; deferring", position.describe(at))
        self.defer(trigger=WatermarkTrigger(self._path(), at, self.conn_id, self.url_variable,
                                            float(self.poke_interval), self.working_dir),
                   method_name="execute_complete", timeout=timedelta(seconds=float(self.timeout)))

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        if not event or event.get("status") != "done":
            raise AirflowFailException(f"pipeline file {self.pipeline}: {(event or {}).get('message', 'no event')}")
        self.log.info("pipeline %s: complete up to %s (batch %s, watermark %s)", event.get("pipeline"),
                      event.get("until"), event.get("last_batch_id"), event.get("watermark"))
        return {k: v for k, v in event.items() if k != "status"}


__all__ = ["EmatixWatermarkSensor", "until_us"]
