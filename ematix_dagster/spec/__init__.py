"""The pipeline spec: typed dataclasses, TOML load/dump and every load-time rule.

The TOML file is the single description of a pipeline (docs/contract/toml-reference.md). The dataclasses mirror it one
to one so that ``load_pipeline_str(dump_pipeline(spec)) == spec``. Strings keep their ``${NAME}``
placeholders, so secrets stay out of dumps, fingerprints and code versions; whatever does I/O works
on :meth:`PipelineSpec.resolved`, the copy with every placeholder expanded.

Every rule is checked when the spec is built, so a bad config fails before Spark starts, with a
:class:`PipelineConfigError` that names the key, the value and the fix. Types are checked on the
spec as written (from the dataclass annotations: TOML gives ``"false"`` where a boolean was meant),
values on the resolved copy (``table = "${SCHEMA}.clicks"`` is a valid table once SCHEMA is set).

The dataclasses live in :mod:`.window` (with what the spec knows of each window kind), :mod:`.rows`
(row pipelines), :mod:`.sources`, :mod:`.sinks`, :mod:`.run` and :mod:`.model` (with what
``[run] window_state = "executors"`` refuses in :mod:`.window_state`), the TOML
I/O in :mod:`.toml_io`, the ``${NAME}`` handling in :mod:`.environment`, the type checks in
:mod:`.type_checks` and the shared values and bounds in :mod:`.rules`; callers import from this
package.
"""

from ematix_dagster.spec.backfill import Backfill, BackfillSource
from ematix_dagster.spec.emit import EmitRelease
from ematix_dagster.spec.environment import resolve_env
from ematix_dagster.spec.model import PipelineSpec, StateStoreConfig, spec_warnings
from ematix_dagster.spec.rows import RowTransform
from ematix_dagster.spec.rules import JAVA_INT_MAX, MAX_DURATION_MS, STATE_STORE_KINDS
from ematix_dagster.spec.run import Run
from ematix_dagster.spec.sinks import DeadLetter, Target
from ematix_dagster.spec.sources import Source
from ematix_dagster.spec.toml_io import (
    dump_pipeline,
    load_pipeline,
    load_pipeline_str,
    spec_from_dict,
    spec_to_dict,
    with_overrides,
)
from ematix_dagster.spec.trigger import EmitTrigger
from ematix_dagster.spec.window import Aggregation, Window

__all__ = [
    "Aggregation", "Backfill", "BackfillSource", "DeadLetter", "EmitRelease", "EmitTrigger", "JAVA_INT_MAX",
    "MAX_DURATION_MS", "PipelineSpec", "RowTransform",
    "Run", "STATE_STORE_KINDS", "Source", "StateStoreConfig", "Target", "Window", "dump_pipeline", "load_pipeline",
    "load_pipeline_str", "resolve_env", "spec_from_dict", "spec_to_dict", "spec_warnings", "with_overrides",
]
