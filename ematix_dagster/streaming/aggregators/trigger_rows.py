"""The hidden row count of the ``count`` and ``interval`` emit triggers (docs/contract/emission.md).

Each group holds ``(rows, mark)``: the accepted rows it has taken and how many it had at the
trigger's last look (``count``: the end of the previous batch; ``interval``: the last firing). Both
merge by sum, so a session merged from several starts from the sum of its parts, and living in the
group's accumulators they are stored, restored and evicted with it. The output never shows them.

>>> rows = TriggerRows()
>>> rows.merge_column([None, (4, 4)], [3, 2])  # this batch's partials: counts from Spark
[(3, 0), (6, 4)]
>>> rows.merge((6, 4), (2, 2))  # two sessions merge
(8, 6)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ematix_dagster.streaming.aggregators.aggregator import NONE, Aggregator
from ematix_dagster.streaming.aggregators.basic import Count

if TYPE_CHECKING:
    from pyspark.sql import Column

    from ematix_dagster.streaming.aggregators.aggregator import SparkInput

#: its name in messages about stored state (an alias no user column can take)
TRIGGER_ROWS_ALIAS = "_trigger_rows"


class TriggerRows(Aggregator):
    """``(rows, mark)`` per group; the partial is Spark's ``count(*)`` of the group's rows."""

    hidden = True
    state_types = frozenset({NONE, tuple})
    looks_inside = True
    expected = "a pair of row counts"
    state_bytes = 100

    def spark_partials(self, spark: SparkInput) -> list[Column]:
        return Count().spark_partials(spark)

    def merge(self, acc: Any, partial: Any) -> Any:
        rows, mark = acc or (0, 0)
        if type(partial) is tuple:  # another group's pair: sessions merging
            return (rows + partial[0], mark + partial[1])
        return (rows + (partial or 0), mark)

    def scan_contents(self, states: list[Any], types: set[type]) -> bool:
        return all(self.check_state(s) is None for s in states)

    def check_state(self, acc: Any) -> str | None:
        if acc is None or (type(acc) is tuple and len(acc) == 2 and all(type(n) is int and n >= 0 for n in acc)):
            return None
        return f"expected {self.expected}, got {acc!r:.60}"
