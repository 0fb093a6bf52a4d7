"""count_distinct: approximate (HLL sketches) or exact (sets of canonical values), docs/contract/aggregators.md."""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any, Sequence

from datasketches import hll_sketch, hll_union

from ematix_dagster.errors import CorruptState, StateCapExceeded
from ematix_dagster.spec import Aggregation
from ematix_dagster.streaming.aggregators.aggregator import (
    NONE,
    Aggregator,
    SparkInput,
    describe_value,
    merged_rows,
    not_none,
)

if TYPE_CHECKING:
    from pyspark.sql import Column

_HEADER = itemgetter(slice(0, 4))


class _Distinct(Aggregator):
    """What both modes share: the mode belongs to the state's shape."""

    def fingerprint(self, spec: Aggregation) -> list[Any]:
        return [spec.agg, spec.column, spec.as_, spec.distinct_mode]


class ApproxDistinct(_Distinct):
    """HLL sketches as compact bytes; unions happen only when a group gets a second partial.

    Keeping bytes (not sketch objects) makes the common case, a group seen once per window,
    free of deserialisation, and the state is already in its persisted form. Spark's
    ``hll_sketch_agg`` and DataSketches hash alike (docs/design.md).
    """

    state_types = frozenset({NONE, bytes})
    looks_inside = True

    def __init__(self, lg_k: int) -> None:
        self.lg_k = lg_k
        self.state_bytes = 80 + (1 << lg_k)  # the dense image, the most a sketch grows to
        # A DataSketches HLL image starts with: preamble ints (2 list, 3 set, 10 HLL mode), serial
        # version 1, family 7 (HLL), lg_k; every image has at least 8 bytes.
        self._headers = frozenset(bytes([pre, 1, 7, lg_k]) for pre in (2, 3, 10))

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        return [spark.functions.hll_sketch_agg(spark.hll_input(), self.lg_k)]

    def merge(self, acc: Any, partial: Any) -> Any:
        if partial is None:
            return acc
        if acc is None:
            return bytes(partial)
        union = hll_union(self.lg_k)
        union.update(self._sketch(acc))
        union.update(hll_sketch.deserialize(bytes(partial)))
        return union.get_result().serialize_compact()

    def merge_column(self, accs: Sequence[Any], partials: Sequence[Any]) -> list[Any]:
        """A window's new groups take Spark's sketch bytes (Arrow's) as they are; held ones are
        unioned through one union, reset for each group: a union per group, or a method call per
        step, costs a fifth of the merge."""
        if accs.count(None) == len(accs):
            return list(partials)
        union = hll_union(self.lg_k)
        reset, update, get_result, load = union.reset, union.update, union.get_result, hll_sketch.deserialize

        def merged(acc: Any, partial: Any) -> Any:
            if partial is None:
                return acc
            if acc is None:
                return partial
            reset()
            update(load(acc))
            update(load(partial))
            return get_result().serialize_compact()

        try:
            return list(map(merged, accs, partials))
        except Exception:  # noqa: BLE001 - a stored sketch that does not load: found again, named
            return merged_rows(self.merge, accs, partials)

    def result(self, acc: Any) -> Any:
        if acc is None:
            return 0
        return round(self._sketch(acc).get_estimate())

    def result_column(self, accs: list[Any]) -> list[Any]:
        load = hll_sketch.deserialize
        try:
            return [0 if acc is None else round(load(acc).get_estimate()) for acc in accs]
        except Exception:  # noqa: BLE001 - a stored sketch that does not load: found again, named
            return list(map(self.result, accs))

    def _sketch(self, acc: bytes) -> Any:
        """The stored sketch; one that the restore's header scan let through but does not load is corrupt."""
        try:
            return hll_sketch.deserialize(acc)
        except Exception as exc:  # noqa: BLE001 - DataSketches raises ValueError/IndexError/RuntimeError
            raise CorruptState(f"stored HLL sketch is corrupt: {_describe_sketch(acc)} does not load ({exc}); "
                               "restore the state store from a backup, or start over with "
                               "`ematix-dagster reset PIPELINE.toml --yes`") from None

    def check_state(self, acc: Any) -> str | None:
        if acc is None:
            return None
        if type(acc) is not bytes:
            return f"expected an HLL sketch (bytes), got {describe_value(acc)}"
        try:
            lg_k = hll_sketch.deserialize(acc).lg_config_k
        except Exception as exc:  # noqa: BLE001 - DataSketches raises ValueError/IndexError/RuntimeError
            return f"{_describe_sketch(acc)} are not a DataSketches HLL sketch image ({exc})"
        if lg_k != self.lg_k:
            return f"the HLL sketch has lg_k {lg_k}, but the pipeline's hll_precision is {self.lg_k}"
        if not self.scan_states([acc]):
            return f"{_describe_sketch(acc)} do not start with a DataSketches HLL preamble"
        return None

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        """Preamble headers only: opening every sketch would cost more than decoding the whole state."""
        sketches = not_none(states, types)
        return set(map(_HEADER, sketches)) <= self._headers and min(map(len, sketches), default=8) >= 8


class ExactDistinct(_Distinct):
    """A set of canonical values, capped by ``max_distinct_values_per_group``."""

    # The cap is not checked here: caps may be lowered between runs (the next merge enforces it).
    state_types = frozenset({NONE, set, frozenset})
    expected = "a set of distinct values"
    state_bytes = 220  # the empty set
    bytes_per_value = 140  # a set slot and a short canonical string

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        return [spark.functions.collect_set(spark.canonical())]

    def merge(self, acc: Any, partial: Any) -> Any:
        if not partial:
            return acc
        merged = set(acc or ()) | set(partial)
        if len(merged) > self.cap:
            raise StateCapExceeded(f"max_distinct_values_per_group={self.cap} reached")
        return merged

    def result(self, acc: Any) -> Any:
        return len(acc) if acc else 0


def _describe_sketch(acc: bytes) -> str:
    return f"{len(acc)} bytes ({acc[:8].hex()}{'...' if len(acc) > 8 else ''})"
