"""Arrow at the boundary between Spark and the driver's window state.

Partials arrive as an Arrow table (one row per (window start, group)); emitted rows leave as an Arrow table with the
output schema (docs/contract/emission.md#output-columns): window bounds, group columns, aggregations, plus
``_emit_kind`` and ``_emit_seq``. A kind with an id column (sessions: ``session_id``) adds it after the bounds.
``_emit_seq`` (the row's order within the batch, from 0) is on every kind's rows: a batch may hold a key's ``retract``
row before the row replacing it, and an early trigger lets the end-of-input flush write a key the batch's own file
wrote, so readers order a key's rows by ``(batch_id, _emit_seq)`` (docs/contract/emission.md).
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from ematix_dagster.columns import EMIT_KIND, EMIT_SEQ, PARTIAL_PREFIX, WINDOW_START
from ematix_dagster.spark.plans.window_plan import BatchPlan
from ematix_dagster.streaming.emitted import Column, Emitted, GroupKey
from ematix_dagster.streaming.kinds import window_kind
from ematix_dagster.streaming.kinds.state_columns import ints
from state_store.int_key_column import IntKeyColumn

UTC_MICROS = pa.timestamp("us", tz="UTC")


def output_schema(plan: BatchPlan) -> pa.Schema:
    window, types = plan.spec.window, plan.output_types
    kind = window_kind(window)
    fields = [pa.field(window.window_start_column, UTC_MICROS), pa.field(window.window_end_column, UTC_MICROS)]
    if kind.id_column is not None:
        fields.append(pa.field(kind.id_column, pa.int64()))
    fields += [pa.field(g, arrow_type(types[g])) for g in window.group_by]
    for a, agg in zip(window.aggregations, plan.aggregators):
        input_type = arrow_type(types[a.column]) if agg.reads_input_type else None  # type: ignore[index]
        fields.append(pa.field(a.as_, agg.output_type(input_type)))
    fields += [pa.field(EMIT_KIND, pa.string()), pa.field(EMIT_SEQ, pa.int64())]
    return pa.schema(fields)


def arrow_type(dtype: T.DataType) -> pa.DataType:
    """The Arrow type a Spark column reaches the targets as (timestamps: UTC µs)."""
    if isinstance(dtype, T.TimestampType):
        return UTC_MICROS
    return to_arrow_type(dtype)


def partial_lists(plan: BatchPlan, table: pa.Table, start_column: str = WINDOW_START, typed: bool = False
                  ) -> tuple[Sequence[int], Sequence[GroupKey], list[Any]]:
    """Columns of the partials table as the plain lists the window state's ``merge`` takes; keys
    of one integer column without a NULL stay that column (``state_store.int_key_column``).

    ``typed`` (a state holding typed accumulator columns: fixed windows) hands over the starts,
    and each partial an aggregator can fold as an array (``Aggregator.array_partials``), as NumPy
    arrays instead: no Python value per row on either side of the merge.
    """
    window = plan.spec.window
    starts: Sequence[int] = (table.column(start_column).to_numpy() if typed
                             else table.column(start_column).to_pylist())
    keys: Sequence[GroupKey] | None = None
    if len(window.group_by) == 1:
        keys = IntKeyColumn.of_arrow(table.column(window.group_by[0]))
    if keys is None:
        group_cols = [table.column(g).to_pylist() for g in window.group_by]
        keys = list(zip(*group_cols)) if group_cols else [()] * len(starts)
    partials: list[Any] = []  # per aggregator: a list, or a NumPy array (typed)
    for i, agg in enumerate(plan.aggregators):
        names = agg.partial_names(f"{PARTIAL_PREFIX}{i}")
        array = agg.array_partials(table.column(names[0])) if typed and len(names) == 1 else None
        partials.append(array if array is not None else agg.from_arrow([table.column(n).to_pylist() for n in names]))
    return starts, keys, partials


def rows_to_arrow(schema: pa.Schema, emitted: Emitted, group_width: int,
                  row_ids: Sequence[int] | None = None, first_seq: int = 0) -> pa.Table:
    """The emitted rows as the output schema's columns, in their order (``row_ids``: one per row,
    for a kind with an id column). ``_emit_seq`` numbers the rows ``first_seq``, ``first_seq + 1``,
    ... as given: the end-of-input flush continues the numbers of the last batch's rows."""
    columns: list[Sequence[Any] | np.ndarray] = [()] * len(schema)
    first_key = 2 if row_ids is None else 3
    n = len(emitted)
    if emitted:  # window bounds through int64 (Arrow converts a list of ints to timestamps ten times slower)
        columns[0], columns[1] = _int64(emitted.starts), _int64(emitted.ends)
        columns[schema.get_field_index(EMIT_KIND)] = emitted.kinds
        keys = emitted.keys
        if isinstance(keys, IntKeyColumn):
            columns[first_key] = keys.ids
        else:
            flat = list(chain.from_iterable(keys))  # the keys' columns by slicing: ``zip(*keys)`` passes
            for i in range(group_width):            # every key as an argument, five times slower
                columns[first_key + i] = flat[i::group_width]
        for j, values in enumerate(emitted.values):
            columns[first_key + group_width + j] = values
    if row_ids is not None:
        columns[2] = list(row_ids)
    columns[schema.get_field_index(EMIT_SEQ)] = np.arange(first_seq, first_seq + n, dtype=np.int64)
    return pa.table([pa.array(c, type=f.type) for c, f in zip(columns, schema)], schema=schema)


def _int64(column: Column) -> np.ndarray:
    """A column of ints (a list, or already a NumPy array) as int64."""
    return column.astype(np.int64, copy=False) if isinstance(column, np.ndarray) else ints(column, len(column))
