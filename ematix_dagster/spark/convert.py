"""Arrow at the boundary between Spark and the driver's window state.

Partials arrive as an Arrow table (one row per (window start, group)); emitted rows leave as an
Arrow table with the output schema of seed 000: window bounds, group columns, aggregations, plus
``_emit_kind``.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from ematix_dagster.spark.partials import BatchPlan
from ematix_dagster.streaming.window_state import EmittedRow

UTC_MICROS = pa.timestamp("us", tz="UTC")


def output_schema(plan: BatchPlan) -> pa.Schema:
    window, types = plan.spec.window, plan.output_types
    fields = [pa.field(window.window_start_column, UTC_MICROS), pa.field(window.window_end_column, UTC_MICROS)]
    fields += [pa.field(g, _arrow(types[g])) for g in window.group_by]
    for a, agg in zip(window.aggregations, plan.aggregators):
        input_type = _arrow(types[a.column]) if agg.reads_input_type else None  # type: ignore[index]
        fields.append(pa.field(a.as_, agg.output_type(input_type)))
    fields.append(pa.field("_emit_kind", pa.string()))
    return pa.schema(fields)


def _arrow(dtype: T.DataType) -> pa.DataType:
    if isinstance(dtype, T.TimestampType):
        return UTC_MICROS
    return to_arrow_type(dtype)


def partial_lists(plan: BatchPlan, table: pa.Table) -> tuple[list[int], list[tuple[Any, ...]], list[list[Any]]]:
    """Columns of the partials table as the plain lists ``WindowState.merge`` takes."""
    window = plan.spec.window
    starts = table.column("_ws").to_pylist()
    group_cols = [table.column(g).to_pylist() for g in window.group_by]
    keys = list(zip(*group_cols)) if group_cols else [()] * len(starts)
    partials = [agg.from_arrow([table.column(name).to_pylist() for name in agg.partial_names(f"_p{i}")])
                for i, agg in enumerate(plan.aggregators)]
    return starts, keys, partials


def rows_to_arrow(schema: pa.Schema, rows: Sequence[EmittedRow], group_width: int) -> pa.Table:
    columns: list[list[Any]] = [[] for _ in schema]
    for r in rows:
        columns[0].append(r.start)
        columns[1].append(r.end)
        for i, v in enumerate(r.key):
            columns[2 + i].append(v)
        for j, v in enumerate(r.values):
            columns[2 + group_width + j].append(v)
        columns[-1].append(r.kind)
    return pa.table([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)
