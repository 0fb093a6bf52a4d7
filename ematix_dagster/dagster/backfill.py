"""A pipeline's backfill as a partitioned Dagster asset (docs/contract/backfill.md).

Dagster's partitions are the ``[backfill]`` partitions (hourly or daily, UTC, from ``start``), so
the UI's partition picker and Dagster's backfill launcher select ranges the engine accepts. A
backfill of several partitions is one run (``BackfillPolicy.single_run()``): one Spark job over
the whole range and one transaction, instead of a run and a transaction per partition. The asset
rewrites rows of the streaming asset's table, so it is a separate key beside it
(``<streaming key>-backfill``) with the same upstream sources, and the same table name, address
and owners: the catalog shows that both write one table. Its step reads the range back after the
rewrite (the ``rewritten_range`` check), so the run says what the table holds, not only what the
backfill sent.
"""

import warnings
from typing import Optional, Sequence

import dagster as dg

from ematix_dagster.dagster.assets import PipelineLike, effective_spec, pipeline_failure
from ematix_dagster.dagster.checks import backfill_check_specs, evaluate_rewritten_range
from ematix_dagster.dagster.lineage import output_schema_metadata, target_metadata
from ematix_dagster.dagster.pipeline import PIPELINE_TAG, EmatixPipeline
from ematix_dagster.dagster.resources import EmatixSparkResource, MetricsResource, StateStoreResource
from ematix_dagster.dagster.translator import EmatixTranslator
from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec.backfill import Backfill, start_datetime


def backfill_partitions(backfill: Backfill) -> dg.TimeWindowPartitionsDefinition:
    """``[backfill]``'s partitions as Dagster's (UTC)."""
    start = start_datetime(backfill.start_us)
    if backfill.partition == "hourly":
        return dg.HourlyPartitionsDefinition(start_date=start, timezone="UTC")
    return dg.DailyPartitionsDefinition(start_date=start, timezone="UTC")


def backfill_asset(pipeline: PipelineLike, *, translator: Optional[EmatixTranslator] = None,
                   key: Optional[dg.AssetKey] = None, group_name: Optional[str] = None,
                   owners: Optional[Sequence[str]] = None) -> dg.AssetsDefinition:
    """The partitioned asset that backfills ``pipeline`` (which must have ``[backfill]``); it needs the
    resources ``spark``, ``state_store`` and ``metrics``, as the streaming asset does. ``owners``
    defaults to the translator's for the pipeline: pass the streaming asset's when they were given
    to :func:`streaming_pipeline_assets` instead."""
    translator = translator or EmatixTranslator()
    p = EmatixPipeline.load(pipeline)
    backfill = p.spec.backfill
    if backfill is None:
        raise PipelineConfigError("backfill", f"pipeline {p.name} has no [backfill] table",
                                  "add [backfill] with partition and start (docs/contract/backfill.md)")
    streaming = translator.get_asset_key(p)
    asset_key = key or dg.AssetKey([*streaming.path[:-1], f"{streaming.path[-1]}-backfill"])
    deps = [k for k in dict.fromkeys(translator.get_source_asset_key(p, s) for s in p.spec.sources) if k is not None]

    with warnings.catch_warnings():
        # backfill_policy is "beta" in Dagster 1.13 (pinned): the single run is the point here
        warnings.simplefilter("ignore", dg.BetaWarning)
        return _asset(p, translator, backfill, asset_key, deps, group_name,
                      list(translator.get_owners(p) if owners is None else owners))


def _asset(p: EmatixPipeline, translator: EmatixTranslator, backfill: Backfill, asset_key: dg.AssetKey,
           deps: list[dg.AssetKey], group_name: Optional[str], owners: list[str]) -> dg.AssetsDefinition:
    @dg.asset(
        key=asset_key,
        description=(f"Backfill of `{p.name}` ({backfill.partition} partitions from {backfill.start}): rewrites "
                     f"the windows starting in the selected partitions of `{p.spec.target.table}` from archived "
                     "input (docs/contract/backfill.md)."),
        partitions_def=backfill_partitions(backfill),
        backfill_policy=dg.BackfillPolicy.single_run(),
        kinds={"spark", "postgres"},
        tags={PIPELINE_TAG: p.name},
        group_name=group_name or translator.get_group_name(p),
        code_version=translator.get_code_version(p),
        pool=f"ematix-backfill-{p.name}",
        deps=deps or None,
        owners=owners,
        metadata=target_metadata(p.spec.target),
        check_specs=backfill_check_specs(asset_key),
    )
    def _backfill_asset(context: dg.AssetExecutionContext, spark: EmatixSparkResource,
                        state_store: StateStoreResource, metrics: MetricsResource) -> dg.MaterializeResult:
        from ematix_dagster.backfill import run_backfill

        window = context.partition_time_window
        spec = effective_spec(p.spec, state_store, metrics)
        try:
            result = run_backfill(spec, window.start.isoformat(), window.end.isoformat(), spark=spark.spark_session,
                                  progress=context.log.info)
        except Exception as exc:  # noqa: BLE001 - classified as the streaming asset classifies
            raise pipeline_failure(context, p, exc) from exc
        context.log.info(f"backfill {p.name}: {result.span} rewritten: {result.windows} windows, "
                         f"{result.rows_written} rows")
        check = evaluate_rewritten_range(asset_key, spec, window.start, window.end, str(result.span),
                                         result.rows_written)
        return dg.MaterializeResult(metadata={
            "range": str(result.span),
            "windows_rewritten": result.windows, "rows_written": result.rows_written,
            "rows_replaced": result.rows_deleted, "rows_read": result.rows_read,
            "duration_seconds": round(result.seconds, 3), **output_schema_metadata(result)},
            check_results=[check])

    return _backfill_asset


__all__ = ["backfill_asset", "backfill_partitions"]
