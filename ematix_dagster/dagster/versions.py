"""Code and data versions on every materialization of a pipeline asset.

Dagster writes a materialization's provenance (``dagster/code_version``, ``dagster/data_version``
and the input versions it was computed from) only for a step's output, that is when a streaming
step ends. A long-running step's per-batch materializations would carry none: the asset's data
version stays ``INITIAL`` and a spec changed while the pipeline runs (a new code version) would
leave it FRESH, exactly when the run is outdated. So each per-batch materialization carries the
same tags Dagster writes for an output: the code version the run started with, a data version
for the batch (its id and watermark: what the target holds after it) and the current versions of
the asset's inputs (its sources and the pipelines it reads), so that Dagster's staleness
resolver compares them as it does for any asset.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import dagster as dg
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
    DEFAULT_DATA_VERSION,
    NULL_EVENT_POINTER,
    extract_data_version_from_entry,
    get_input_data_version_tag,
    get_input_event_pointer_tag,
)

from ematix_dagster.streaming.kinds import format_us


def batch_data_version(report: Any) -> dg.DataVersion:
    """What the target holds after a batch: the batch id, and the watermark that decided which windows closed."""
    return dg.DataVersion(f"batch {int(report.batch_id)}, watermark {format_us(report.watermark)}")


def input_version_tags(instance: dg.DagsterInstance, keys: Iterable[dg.AssetKey]) -> dict[str, str]:
    """The inputs' current data versions and event pointers, as Dagster records them for an output."""
    tags: dict[str, str] = {}
    for key in keys:
        record = instance.get_latest_data_version_record(key)
        version = extract_data_version_from_entry(record.event_log_entry) if record is not None else None
        tags[get_input_data_version_tag(key)] = (version or DEFAULT_DATA_VERSION).value
        tags[get_input_event_pointer_tag(key)] = str(record.storage_id) if record is not None else NULL_EVENT_POINTER
    return tags


def provenance_tags(code_version: str, data_version: dg.DataVersion,
                    inputs: Mapping[str, str]) -> dict[str, str]:
    """The tags of a per-batch materialization (``inputs``: from :func:`input_version_tags`)."""
    return {CODE_VERSION_TAG: code_version, **inputs, DATA_VERSION_TAG: data_version.value,
            DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}


def batch_provenance(context: Any, key: dg.AssetKey, code_version: str) -> Callable[[Any], dict[str, str]]:
    """The tags for a batch's materialization in this step: the asset's declared code version (a
    translator may set it) and its upstream keys; ``code_version`` and no inputs from a plain op."""
    op_context = getattr(context, "op_execution_context", context)
    deps: list[dg.AssetKey] = []
    if getattr(op_context, "has_assets_def", False):
        assets_def = op_context.assets_def
        code_version = assets_def.code_versions_by_key.get(key) or code_version
        deps = [dep.asset_key for dep in assets_def.specs_by_key[key].deps]
    instance = context.instance
    return lambda report: provenance_tags(code_version, batch_data_version(report), input_version_tags(instance, deps))


__all__ = ["batch_data_version", "batch_provenance", "input_version_tags", "provenance_tags"]
