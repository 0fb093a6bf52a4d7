"""Aggregates collected while another action runs (``DataFrame.observe``), with a fallback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation


@dataclass
class Observed:
    """Aggregates collected while another action runs, with a direct fallback.

    Spark drops an ``observe`` node when the optimiser proves its input empty (an empty
    micro-batch), and the observation is then never filled; the fallback computes the same
    aggregates explicitly in that case.
    """

    observation: Observation
    frame: DataFrame
    exprs: list[Column]

    def values(self) -> dict[str, Any]:
        try:
            values = self.observation.get
        except Exception:  # noqa: BLE001 - the observation was pruned with an empty plan
            values = {}
        if not values:
            values = self.frame.agg(*self.exprs).collect()[0].asDict()
        return values
