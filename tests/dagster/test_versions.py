"""Per-batch materializations carry code, data and input versions, so Dagster's staleness works for a
streaming asset: FRESH while the definition's code version is the one the batches ran with, STALE once the
spec changed (an ephemeral instance; the runtime materializations come from a plain op, as a step's
per-batch ones do; no Spark)."""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

from ematix_dagster.dagster.events import EmatixEventIterator
from ematix_dagster.dagster.versions import batch_data_version, input_version_tags, provenance_tags
from tests.dagster.test_events import KEY, T0, report

SOURCE = dg.AssetKey(["files", "clicks"])


def pipeline_asset(code_version: str) -> dg.AssetsDefinition:
    @dg.asset(key=KEY, code_version=code_version, deps=[SOURCE])
    def _pipeline():
        return None

    return _pipeline


def batch_job(code_version: str, tagged: bool) -> dg.JobDefinition:
    """A run whose only events are a streaming step's per-batch materializations (no output)."""

    @dg.op(out={})
    def batches(context):
        def provenance(r):
            return provenance_tags(code_version, batch_data_version(r), input_version_tags(context.instance, [SOURCE]))

        reports = [report(0, 4, emitted=1, watermark_s=T0 + 60), report(1, 4, emitted=2, watermark_s=T0 + 120)]
        for event in EmatixEventIterator(reports, KEY, throttle_seconds=0, provenance=provenance if tagged else None):
            if isinstance(event, dg.AssetMaterialization):
                yield event

    @dg.job
    def stream():
        batches()

    return stream


def status(instance: dg.DagsterInstance, code_version: str) -> tuple[StaleStatus, list[str]]:
    resolver = get_stale_status_resolver(instance, [pipeline_asset(code_version),
                                                    dg.AssetsDefinition(specs=[dg.AssetSpec(SOURCE)])])
    return resolver.get_status(KEY), [cause.reason for cause in resolver.get_stale_causes(KEY)]


def test_batch_materializations_carry_the_versions_and_a_changed_code_version_makes_the_asset_stale():
    with dg.DagsterInstance.ephemeral() as instance:
        assert batch_job("v1", tagged=True).execute_in_process(instance=instance).success
        latest = instance.get_latest_materialization_event(KEY)
        assert latest is not None
        tags = latest.asset_materialization.tags
        assert tags["dagster/code_version"] == "v1"
        assert tags["dagster/data_version"] == "batch 1, watermark 2026-01-01T00:02:00Z"
        assert tags["dagster/input_data_version/files/clicks"] == "INITIAL"  # a source never observed
        assert status(instance, "v1") == (StaleStatus.FRESH, [])
        assert status(instance, "v2") == (StaleStatus.STALE, ["has a new code version"])


def test_without_the_versions_a_changed_spec_leaves_the_asset_fresh():
    """What the tags fix: untagged batch materializations have no provenance to compare."""
    with dg.DagsterInstance.ephemeral() as instance:
        assert batch_job("v1", tagged=False).execute_in_process(instance=instance).success
        assert status(instance, "v2") == (StaleStatus.FRESH, [])


def test_the_final_result_carries_the_last_batchs_data_version():
    events = list(EmatixEventIterator([report(4, 3, emitted=1, watermark_s=T0 + 60)], KEY, throttle_seconds=0))
    assert events[-1].data_version == dg.DataVersion("batch 4, watermark 2026-01-01T00:01:00Z")
    assert list(EmatixEventIterator([], KEY))[-1].data_version is None
