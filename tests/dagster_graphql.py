"""GraphQL reads and writes of a running ``dagster dev`` (:class:`tests.dagster_support.Dagit`): runs,
their events, assets and their checks, sensors, pools."""

from __future__ import annotations

import json
import re
import time

from tests.dagster_support import LOCATION, Dagit, wait_for


def run_status(dagit: Dagit, run_id: str) -> str:
    return dagit.client.get_run_status(run_id).value


def run_events(dagit: Dagit, run_id: str) -> list[dict]:
    """Every event of a run: ``__typename``, ``message``, ``level``, numeric metadata entries, a step failure's ``error``."""
    data = dagit.query("""query($runId: ID!) { runOrError(runId: $runId) { ... on Run {
        eventConnection(afterCursor: null) { events { __typename
            ... on MessageEvent { message level }
            ... on ExecutionStepFailureEvent { error { message } }
            ... on MaterializationEvent { metadataEntries { label
                ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } } }
            ... on ObservationEvent { metadataEntries { label
                ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } } }
        } } } } }""", {"runId": run_id})
    return data["runOrError"]["eventConnection"]["events"]


def materializations(dagit: Dagit, run_id: str) -> list[dict]:
    return [e for e in run_events(dagit, run_id) if e["__typename"] == "MaterializationEvent"]


def materialization_tags(dagit: Dagit, run_id: str) -> list[dict]:
    """A run's materializations: ``tags`` and ``labels`` (dicts), ``columns`` of a column schema."""
    data = dagit.query("""query($runId: ID!) { runOrError(runId: $runId) { ... on Run {
        eventConnection(afterCursor: null) { events { ... on MaterializationEvent { tags { key value }
            metadataEntries { label ... on TableSchemaMetadataEntry { schema { columns { name } } } } } } } } } }""",
                       {"runId": run_id})
    found = []
    for event in data["runOrError"]["eventConnection"]["events"]:
        if "tags" not in event:
            continue
        entries = event["metadataEntries"]
        columns = [c["name"] for e in entries if "schema" in e for c in e["schema"]["columns"]]
        found.append({"tags": {t["key"]: t["value"] for t in event["tags"]}, "labels": {e["label"] for e in entries},
                      "columns": columns})
    return found


def asset_nodes(dagit: Dagit) -> dict[str, dict]:
    """Every asset node by key (``a/b``): code version, upstream keys, stale status and causes, text metadata."""
    data = dagit.query("""{ assetNodes { assetKey { path } opVersion dependencyKeys { path } staleStatus
        staleCauses { reason } metadataEntries { label ... on TextMetadataEntry { text } } } }""")
    return {"/".join(n["assetKey"]["path"]): {
        "code_version": n["opVersion"], "deps": {"/".join(k["path"]) for k in n["dependencyKeys"]},
        "stale": n["staleStatus"], "causes": [c["reason"] for c in n["staleCauses"]],
        "metadata": {e["label"]: e.get("text") for e in n["metadataEntries"]}} for n in data["assetNodes"]}


def check_statuses(dagit: Dagit, asset_path: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """Check name -> (status, run id) of its execution for the asset's latest materialization (a runless
    evaluation has run id ""; (None, None): none)."""
    data = dagit.query("""query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode {
        assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization { status runId } } } }
        } } }""", {"key": {"path": asset_path}})
    checks = data["assetNodeOrError"]["assetChecksOrError"]["checks"]
    return {c["name"]: ((e := c["executionForLatestMaterialization"]) and (e["status"], e["runId"])) or (None, None)
            for c in checks}


def check_executions(dagit: Dagit, asset_path: list[str], check: str) -> list[dict]:
    """Every execution of a check, newest first: status, run id, description and numeric metadata
    (``evaluation.values``: label -> number)."""
    data = dagit.query("""query($key: AssetKeyInput!, $name: String!) {
        assetCheckExecutions(assetKey: $key, checkName: $name, limit: 200) {
            status runId evaluation { description metadataEntries { label
                ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } } } } }""",
                       {"key": {"path": asset_path}, "name": check})
    executions = data["assetCheckExecutions"]
    for execution in executions:
        evaluation = execution["evaluation"] or {}
        evaluation["values"] = {e["label"]: e.get("intValue", e.get("floatValue"))
                                for e in evaluation.get("metadataEntries", [])}
    return executions


def asset_events(dagit: Dagit, asset_path: list[str]) -> list[dict]:
    """Every materialization and observation of an asset, newest first: ``kind``, ``run_id``,
    ``description``, ``tags`` and ``metadata`` (label -> int, or the parsed JSON of a JSON entry)."""
    entries = """metadataEntries { label ... on IntMetadataEntry { intValue } ... on JsonMetadataEntry { jsonString } }"""
    data = dagit.query("""query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { ... on Asset {
        assetMaterializations(limit: 10000) { runId timestamp description tags { key value } %s }
        assetObservations(limit: 10000) { runId timestamp description %s } } } }""" % (entries, entries),
                       {"key": {"path": asset_path}})
    asset = data["assetOrError"]
    found = []
    for kind, events in (("materialization", asset["assetMaterializations"]),
                         ("observation", asset["assetObservations"])):
        for event in events:
            metadata = {e["label"]: json.loads(e["jsonString"]) if "jsonString" in e else e.get("intValue")
                        for e in event["metadataEntries"]}
            found.append({"kind": kind, "run_id": event["runId"], "timestamp": float(event["timestamp"]),
                          "description": event["description"] or "",
                          "tags": {t["key"]: t["value"] for t in event.get("tags", [])}, "metadata": metadata})
    return sorted(found, key=lambda e: -e["timestamp"])


def event_pid(dagit: Dagit, run_id: str, message_pattern: str) -> int | None:
    """The pid in the first event message matching ``message_pattern`` (one group: the pid)."""
    for event in run_events(dagit, run_id):
        match = re.search(message_pattern, event.get("message") or "")
        if match:
            return int(match.group(1))
    return None


def pipeline_runs(dagit: Dagit, pipeline: str) -> list[dict]:
    """Runs tagged ``ematix/pipeline=<pipeline>``, newest first: id, status, tags."""
    data = dagit.query("""query($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results {
        runId status tags { key value } } } } }""", {"filter": {"tags": [{"key": "ematix/pipeline",
                                                                           "value": pipeline}]}})
    runs = data["runsOrError"]["results"]
    return [{"run_id": r["runId"], "status": r["status"], "tags": {t["key"]: t["value"] for t in r["tags"]}}
            for r in runs]


def set_sensor(dagit: Dagit, sensor: str, running: bool) -> None:
    selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": sensor}
    if running:
        data = dagit.query("""mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) {
            __typename ... on PythonError { message } } }""", {"s": selector})
        assert data["startSensor"]["__typename"] == "Sensor", data
    else:
        data = dagit.query("""query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
            ... on Sensor { jobOriginId sensorState { selectorId } } } }""", {"s": selector})
        sensor = data["sensorOrError"]
        data = dagit.query("""mutation($o: String!, $i: String!) { stopSensor(jobOriginId: $o, jobSelectorId: $i) {
            __typename ... on PythonError { message } } }""",
                           {"o": sensor["jobOriginId"], "i": sensor["sensorState"]["selectorId"]})
        assert data["stopSensor"]["__typename"] == "StopSensorMutationResult", data


def claimed_slots(dagit: Dagit, pool: str) -> list[str]:
    """Run ids holding a slot of a concurrency pool."""
    data = dagit.query("""query($key: String!) { instance { concurrencyLimit(concurrencyKey: $key) {
        claimedSlots { runId } } } }""", {"key": pool})
    return [s["runId"] for s in data["instance"]["concurrencyLimit"]["claimedSlots"]]


def terminate(dagit: Dagit, run_id: str) -> float:
    """Terminate a run; seconds until it is CANCELED (at most 60)."""
    started = time.monotonic()
    dagit.client.terminate_run(run_id)
    wait_for(lambda: run_status(dagit, run_id) == "CANCELED", 60, "the run to reach CANCELED", step=0.5)
    return time.monotonic() - started


def assert_reads_as_a_cancel(dagit: Dagit, run_id: str) -> None:
    """A terminated pipeline run: CANCELED, the stop logged, no retry request and no step failure."""
    events = run_events(dagit, run_id)
    types = [e["__typename"] for e in events]
    messages = [e.get("message") or "" for e in events]
    assert "ExecutionStepUpForRetryEvent" not in types and "ExecutionStepFailureEvent" not in types, types
    assert not any("requested a retry" in m for m in messages)
    assert any("terminate requested; the streaming query stopped at a batch boundary" in m for m in messages), [
        (t, m) for t, m in zip(types, messages) if m][-12:]
    assert "RunCanceledEvent" in types and "RunFailureEvent" not in types, types[-3:]
