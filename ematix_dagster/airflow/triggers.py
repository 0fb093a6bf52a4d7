"""The watermark trigger: waits in the triggerer until a pipeline's target is complete up to a time.

It polls the state store without Spark (:func:`~.watermark.output_position`, in a thread so the
triggerer's event loop never blocks on the database) and fires once
:meth:`~.watermark.OutputPosition.complete_until` holds. It lives in this installed package because
the triggerer imports it by its class path. Its serialized arguments hold the pipeline's path, the
time and a Connection id, never a URL: the trigger reads the Connection itself, and puts its URL in
the pipeline file's placeholder as it loads the file for its own read only (the triggerer's environment is shared by every
trigger and stays untouched).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ematix_dagster.streaming.kinds.time_units import format_us


class WatermarkTrigger(BaseTrigger):
    """Fires ``{"status": "done", ...position}`` once the target is complete up to ``until_us``, or
    ``{"status": "error", "message": ...}`` on a terminal error (a transient one is logged and polled again)."""

    def __init__(self, pipeline: str, until_us: int, conn_id: str | None = None, url_variable: str = "EMATIX_PG_URL",
                 poll_seconds: float = 30.0, working_dir: str | None = None) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.until_us = int(until_us)
        self.conn_id = conn_id
        self.url_variable = url_variable
        self.poll_seconds = float(poll_seconds)
        self.working_dir = working_dir

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"pipeline": self.pipeline, "until_us": self.until_us, "conn_id": self.conn_id,
                 "url_variable": self.url_variable, "poll_seconds": self.poll_seconds,
                 "working_dir": self.working_dir})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from ematix_dagster.airflow.connection import aconnection_url

        values: dict[str, str] = {}
        if self.conn_id:
            values[self.url_variable] = await aconnection_url(self.conn_id)
        until = format_us(self.until_us)
        while True:
            try:
                position = await asyncio.to_thread(read_position, self.pipeline, values, self.working_dir)
            except Exception as exc:  # noqa: BLE001 - terminal errors end the wait, transient ones are retried
                terminal = getattr(exc, "terminal", True)
                if terminal:
                    yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                    return
                self.log.warning("pipeline file %s: %s (retrying in %.0f s)", self.pipeline, exc, self.poll_seconds)
            else:
                if position.complete_until(self.until_us):
                    yield TriggerEvent({"status": "done", "until": until, **position.as_dict()})
                    return
                self.log.info("%s; waiting", position.describe(self.until_us))
            await asyncio.sleep(self.poll_seconds)


def read_position(pipeline: str, values: dict[str, str], working_dir: str | None = None) -> Any:
    """The committed position of the pipeline in file ``pipeline``, its placeholders named in ``values``
    replaced by them; a relative SQLite store path in the file is taken from ``working_dir`` (the
    triggerer's working directory is its own)."""
    from ematix_dagster.airflow.connection import load_with_values
    from ematix_dagster.airflow.watermark import output_position

    spec = load_with_values(Path(pipeline), values)
    store = spec.state_store
    if working_dir and store.kind == "sqlite" and store.path and not Path(store.path).is_absolute():
        spec = dataclasses.replace(spec, state_store=dataclasses.replace(store, path=str(Path(working_dir) / store.path)))
    return output_position(spec)


__all__ = ["WatermarkTrigger", "read_position"]
