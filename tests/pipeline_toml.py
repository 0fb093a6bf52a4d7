"""Pipeline TOML text for tests, built from parameters instead of written out by hand.

Many tests run the same pipeline shape: a ``files`` source of ``id, k, v, page, ts`` rows, one
window grouped by ``k`` with ``count`` / ``sum(v)`` / ``count_distinct(page)``, a target, a state
store and a checkpoint. Each file used to carry its own copy of that text, and the few values in
which the copies differ (window, distinct mode, target, store) were hard to see among the rest.
Here the document is a dict written with ``tomli_w`` (quoting and escaping are its job, not an
f-string's); a caller names only what it changes. A key whose argument is ``None`` is left out,
so the pipeline's own default applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import tomli_w

COLUMNS = "id BIGINT, k STRING, v BIGINT, page STRING"  # the rows of tests/e2e/lateness_helpers.py's row()

Table = dict[str, Any]


def _given(**values: Any) -> Table:
    """The keys whose value is not None: an omitted key keeps the spec's default."""
    return {k: v for k, v in values.items() if v is not None}


def count_sum_distinct(distinct_mode: str | None = "exact") -> list[Table]:
    """``n = count``, ``total = sum(v)``, ``pages = count_distinct(page)``: what the oracle tests compare.

    ``distinct_mode=None`` leaves ``mode`` out (approximate, an HLL sketch); ``"exact"`` caps the
    set at 100 values per group.
    """
    pages = _given(agg="count_distinct", column="page", **{"as": "pages"}, mode=distinct_mode)
    if distinct_mode == "exact":
        pages["max_distinct_values_per_group"] = 100
    return [{"agg": "count", "as": "n"}, {"agg": "sum", "column": "v", "as": "total"}, pages]


def parquet_target(path: Path) -> Table:
    return {"kind": "parquet", "path": str(path)}


def postgres_target(url: str, table: str, *, create_table: bool | None = True,
                    same_transaction: bool | None = None) -> Table:
    """``same_transaction=None`` leaves the key out; ``False`` writes it (as the test had it)."""
    return _given(kind="postgres", url=url, table=table, create_table=create_table, same_transaction=same_transaction)


def postgres_dead_letter(url: str, table: str) -> Table:
    """``[dead_letter]`` into a PostgreSQL table the pipeline creates (``extra={"dead_letter": ...}``)."""
    return {"kind": "postgres", "url": url, "table": table, "create_table": True}


def sqlite_store(path: Path) -> Table:
    return {"kind": "sqlite", "path": str(path)}


def postgres_store(url: str, schema: str | None = None) -> Table:
    return _given(kind="postgres", url=url, schema=schema)


def windowed_pipeline_toml(
    name: str,
    root: Path,
    *,
    # the files source: root/in, one file per micro-batch unless max_files_per_trigger says otherwise
    fmt: str = "parquet",
    columns: str = COLUMNS,
    ts_type: str = "TIMESTAMP",
    event_time_unit: str | None = None,
    max_files_per_trigger: int | None = 1,
    # the window, grouped by k
    window_kind: str = "tumbling",
    duration_ms: int | None = 60_000,
    hop_ms: int | None = None,
    gap_ms: int | None = None,
    max_session_duration_ms: int | None = None,
    max_events_per_group: int | None = None,
    lateness_ms: int | None = None,
    late_data: str | None = None,
    allowed_lateness_ms: int | None = None,
    max_groups_per_window: int | None = 100,
    hll_precision: int | None = None,
    distinct_mode: str | None = "exact",
    aggregations: Sequence[Mapping[str, Any]] | None = None,
    # where results and state go: a parquet target in root/out, a SQLite store in root/state.db
    target: Mapping[str, Any] | None = None,
    state_store: Mapping[str, Any] | None = None,
    checkpoint: Path | None = None,
    trigger: str | None = None,
    end_of_input: str | None = None,
    window_state: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """The TOML text of one windowed pipeline over ``root/in``.

    ``extra`` adds (or replaces) top-level keys and sections; ``aggregations`` replaces
    :func:`count_sum_distinct` (built with ``distinct_mode``) outright.
    """
    source = _given(name="a", kind="files", format=fmt, path=str(root / "in"), schema=f"{columns}, ts {ts_type}",
                    event_time_column="ts", event_time_unit=event_time_unit,
                    max_files_per_trigger=max_files_per_trigger)
    aggs = count_sum_distinct(distinct_mode) if aggregations is None else [dict(a) for a in aggregations]
    window = _given(kind=window_kind, duration_ms=duration_ms, hop_ms=hop_ms, gap_ms=gap_ms,
                    max_session_duration_ms=max_session_duration_ms, max_events_per_group=max_events_per_group,
                    lateness_ms=lateness_ms,
                    late_data=late_data, allowed_lateness_ms=allowed_lateness_ms, group_by=["k"],
                    max_groups_per_window=max_groups_per_window, hll_precision=hll_precision, aggregations=aggs)
    cp = root / "cp" if checkpoint is None else checkpoint
    doc: Table = {
        "pipeline_name": name,
        "sources": [source],
        "transform": {"window": window},
        "target": dict(target) if target is not None else parquet_target(root / "out"),
        "state_store": dict(state_store) if state_store is not None else sqlite_store(root / "state.db"),
        "run": _given(trigger=trigger, checkpoint_location=str(cp), end_of_input=end_of_input,
                      window_state=window_state),
        **(extra or {}),
    }
    return tomli_w.dumps(doc)
