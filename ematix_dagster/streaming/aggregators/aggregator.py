"""The aggregator interface: everything one aggregation needs, in one class.

Modelled on quix-streams' ``Aggregator`` (start / agg / result), extended for a split engine:
Spark pre-aggregates a *partial* per (window, group) and batch on the executors, the driver folds
partials into an accumulator that lives in window state. Each class therefore holds its Spark
partial expressions, the Arrow shape they reach the driver in, the merge (a whole column of a
batch's partials at a time, so the common aggregators merge at C speed), the result, the output
type, the state size estimate and the checks of restored state. ``None`` is the empty accumulator.

The Spark half receives the pyspark side through :class:`SparkInput` instead of importing it, so
the driver engine stays importable and testable without Spark.
"""

from __future__ import annotations

import math
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np
import pyarrow as pa

from ematix_dagster.errors import AggregationOverflow, CorruptState, StateCapExceeded
from ematix_dagster.spec import Aggregation

if TYPE_CHECKING:
    from pyspark.sql import Column

BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1

#: Types of a single column value in stored state (state_store.codec's value types, no containers).
SCALAR_TYPES = frozenset({bool, int, float, str, bytes, Decimal, datetime, date, time, timedelta})
NONE: type = type(None)
PAIR_TYPES = frozenset({NONE, tuple})


def describe_value(value: Any) -> str:
    """A short, safe description of a stored value for messages (type and the start of its repr)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def order_key(value: Any) -> Any:
    """Sort key that matches Spark's ordering of non-null values (NaN is the largest float)."""
    if isinstance(value, float):
        return (1, 0.0) if math.isnan(value) else (0, value)
    return value


def not_none(states: list[Any], types: set[type]) -> list[Any]:
    """``states`` without its None entries (``types``: the types present in ``states``)."""
    return states if NONE not in types else [s for s in states if s is not None]


class SparkInput(Protocol):
    """One aggregation's input column on the Spark side, as the batch plan hands it over."""

    @property
    def functions(self) -> Any:
        """``pyspark.sql.functions``."""

    @property
    def column(self) -> Column | None:
        """The aggregated column (None for ``count(*)``)."""

    @property
    def integral(self) -> bool:
        """The column is BYTE, SHORT, INT or BIGINT."""

    @property
    def decimal(self) -> bool:
        """The column is a DECIMAL."""

    @property
    def numeric(self) -> bool:
        """The column is an integer, floating point or DECIMAL number."""

    @property
    def orderable(self) -> bool:
        """Spark can order the column's values (min/max)."""

    @property
    def type_name(self) -> str:
        """The column's Spark SQL type, for messages."""

    def canonical(self) -> Column:
        """docs/contract/aggregators.md's cast for distinct counting: BIGINT or canonical string (a column computed
        before the groupBy, where an aggregate Spark does not generate code for reads it)."""

    def hll_input(self) -> Column:
        """The canonical value in a form ``hll_sketch_agg`` takes (the empty string counted), a
        column computed before the groupBy like :meth:`canonical`."""


class PartialRowError(Exception):
    """A merge failed on row ``row`` of a batch of partials, so the caller can name its window,
    group and aggregation."""

    def __init__(self, row: int, error: StateCapExceeded | AggregationOverflow | CorruptState) -> None:
        super().__init__(str(error))
        self.row = row
        self.error = error


def merged_rows(merge: Callable[[Any, Any], Any], accs: Sequence[Any], partials: Sequence[Any]) -> list[Any]:
    """``merge`` over the rows of a column; a merge that fails raises :class:`PartialRowError`
    naming the row (found by merging again, one row at a time: failures are rare)."""
    try:
        return list(map(merge, accs, partials))
    except (StateCapExceeded, AggregationOverflow, CorruptState):
        for row, (acc, partial) in enumerate(zip(accs, partials)):
            try:
                merge(acc, partial)
            except (StateCapExceeded, AggregationOverflow, CorruptState) as exc:
                raise PartialRowError(row, exc) from None
        raise


class Aggregator:
    """Base class of the aggregators; subclasses override what differs.

    Restored state decodes to plain values; whether they are this aggregator's accumulators is
    checked in two ways. ``scan_states`` looks at one aggregation's accumulators of every group at
    once with C-level scans (``map`` and ``set``: types, tuple lengths, sketch headers), cheap
    enough for a restore of a million groups. ``check_state`` looks at one accumulator as closely
    as it can and says what is wrong; it names the group a scan rejected, and ``ematix-dagster
    check`` runs it on every accumulator. Every accumulator may be ``None`` (nothing merged yet).
    """

    #: the accumulator types allowed; for most aggregators the type decides alone, the others
    #: (``looks_inside``) check the contents of accumulators of these types in ``scan_contents``
    state_types: frozenset[type] = frozenset({NONE})
    looks_inside = False
    expected = "an accumulator"
    #: driver memory one accumulator adds to a group (list slot and object), measured with
    #: tracemalloc (tests/streaming/test_state_size.py keeps it honest); the start-up state estimate reads it
    state_bytes = 40
    #: driver memory each distinct value held adds (exact distinct sets only)
    bytes_per_value = 0
    #: whether ``output_type`` needs the input column's Arrow type
    reads_input_type = False
    #: held in state for the engine, never written to a target (an emit trigger's row count)
    hidden = False

    # -- Spark: the input, the partial and its Arrow shape ------------------------------------

    def input_problem(self, spec: Aggregation, spark: SparkInput) -> tuple[str, str] | None:
        """(what is wrong, the way out) when the SQL's column cannot feed this aggregator."""
        return None

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        """The partial's aggregate expressions, one per name in ``partial_names``."""
        raise NotImplementedError

    def partial_names(self, name: str) -> tuple[str, ...]:
        """The partial's column names in the partials table, given the aggregation's base name."""
        return (name,)

    def from_arrow(self, columns: Sequence[list[Any]]) -> list[Any]:
        """The partial values of a batch from its columns (``partial_names`` order, as Python lists)."""
        return columns[0]

    # -- driver: merge, result, output -------------------------------------------------------

    def merge(self, acc: Any, partial: Any) -> Any:
        raise NotImplementedError

    def merge_batch(self, states: Sequence[list[Any]], slot: int, partials: Sequence[Any]) -> None:
        """Fold a batch's partials in: ``states[r][slot]`` (row r's group's accumulators) takes ``partials[r]``.

        Rows that share a group share its list and fold in row order (session and sliding windows'
        batches; a fixed window's groups are one per row and merge with :meth:`merge_column`). A
        merge that fails raises :class:`PartialRowError` naming the row.
        """
        merge = self.merge
        for row, (accs, partial) in enumerate(zip(states, partials)):
            try:
                accs[slot] = merge(accs[slot], partial)
            except (StateCapExceeded, AggregationOverflow, CorruptState) as exc:
                raise PartialRowError(row, exc) from None

    def merge_column(self, accs: Sequence[Any], partials: Sequence[Any]) -> list[Any]:
        """The accumulators after ``partials[r]`` is folded into ``accs[r]``, one group per row.

        A batch of fixed windows merges one call per aggregator and window instead of one per
        group; overrides fold the common case with C-level ``map`` calls. Neither input changes
        (``accs`` may be one list shared by several aggregators). A merge that fails raises
        :class:`PartialRowError` naming the row.
        """
        return merged_rows(self.merge, accs, partials)

    # -- a typed accumulator column (fixed windows) ---------------------------------------------

    #: the Arrow type of partials a typed accumulator column holds, and a new group's accumulator
    #: in it, the identity of :meth:`fold_array` (None: accumulators are always Python values)
    array_type: pa.DataType | None = None
    array_empty: Any = None

    def array_partials(self, column: pa.ChunkedArray) -> np.ndarray | None:
        """A batch's partials (one Arrow column) as a NumPy array a typed accumulator column folds
        at C speed, when they are of :attr:`array_type` and none is NULL; None: the partials come
        as Python values (:meth:`from_arrow`) and the column holds objects."""
        if self.array_type is None or column.type != self.array_type or column.null_count:
            return None
        return column.to_numpy()

    def fold_array(self, column: np.ndarray, rows: np.ndarray, partials: np.ndarray) -> None:
        """Fold ``partials[r]`` into ``column[rows[r]]`` in place, a row given several times
        taking its partials in order (``column``: typed, as :meth:`array_partials` gave)."""
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc

    def result_column(self, accs: list[Any]) -> list[Any]:
        """The results of a window's accumulators (one call per aggregator and window, like
        :meth:`merge_column`); it may return ``accs`` itself."""
        return accs if type(self).result is Aggregator.result else list(map(self.result, accs))

    # -- additive accumulators: sliding windows' prefix sums ----------------------------------

    #: how many numbers an accumulator is, when merging adds them up (counts, sums, averages'
    #: pairs); 0: not additive. A window of additive aggregators is a difference of prefix sums.
    additive_parts = 0

    def to_parts(self, acc: Any) -> tuple[Any, ...]:
        """The accumulator as ``additive_parts`` numbers (the empty accumulator as zeros)."""
        raise NotImplementedError

    def to_parts_column(self, accs: list[Any]) -> list[list[Any]]:
        """:meth:`to_parts` of a column of accumulators, one list per part (overrides return
        ``accs`` itself where the accumulator is its own part)."""
        return list(map(list, zip(*map(self.to_parts, accs)))) or [[] for _ in range(self.additive_parts)]

    def from_parts(self, parts: Sequence[Any]) -> Any:
        """The accumulator whose parts are ``parts`` (the inverse of :meth:`to_parts`)."""
        raise NotImplementedError

    def from_parts_column(self, columns: Sequence[list[Any]]) -> list[Any]:
        """:meth:`from_parts` of every window of a batch, given one column per part (overrides
        return a column as it is where the accumulator is the part itself)."""
        return list(map(self.from_parts, zip(*columns)))

    def output_type(self, input_type: pa.DataType | None) -> pa.DataType:
        """The output column's Arrow type (``input_type``: the input's, when ``reads_input_type``)."""
        return pa.int64()

    def fingerprint(self, spec: Aggregation) -> list[Any]:
        """What of ``spec`` the stored accumulators depend on (docs/contract/operations.md's fingerprint)."""
        return [spec.agg, spec.column, spec.as_, None]

    # -- restored state ----------------------------------------------------------------------

    def check_state(self, acc: Any) -> str | None:
        """None when ``acc`` is a valid accumulator of this aggregator, else what is wrong with it."""
        if type(acc) in self.state_types:
            return None
        return f"expected {self.expected}, got {describe_value(acc)}"

    def scan_states(self, states: list[Any]) -> bool:
        """True when every accumulator in ``states`` passes the cheap checks (a restore's bulk check)."""
        types = set(map(type, states))
        return types <= self.state_types and (not self.looks_inside or self.scan_contents(states, types))

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        """The cheap look inside accumulators whose types (``types``) are all in ``state_types``."""
        return True
