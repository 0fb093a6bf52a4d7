"""``${NAME}`` is replaced in every string value where it is used, and kept everywhere else.

One real pipeline (module-scoped, so Spark runs once) has a placeholder, each from its own
variable, in the source path, the parquet target path, the dead-letter path, the SQLite state
path, the checkpoint location and the transform SQL's WHERE literal. The process runs inside the
temporary directory, so a placeholder used literally would show up there as a directory named
``${...}``. The spec, its dump, its fingerprint and its Dagster code version keep the placeholders.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tomli_w
from prometheus_client import CollectorRegistry

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.fingerprint import fingerprint, fingerprint_doc
from ematix_dagster.metrics import StreamingMetrics
from ematix_dagster.operations import check, summary
from ematix_dagster.spec import PipelineSpec, dump_pipeline, load_pipeline_str, spec_warnings

WANTED = "/checkout"
PAGES = ["/home", "/checkout", "/search"]
START = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
SCHEMA = pa.schema([("user_id", pa.int64()), ("page", pa.string()), ("amount", pa.int64()),
                    ("ts", pa.timestamp("us", tz="UTC"))])

#: variable -> directory (under the temporary root) or value it stands for
PLACES = {"EMX_T_SOURCE_DIR": "in/clicks", "EMX_T_TARGET_DIR": "out/windows", "EMX_T_DLQ_DIR": "out/dead",
          "EMX_T_STATE_DB": "state/ematix.db", "EMX_T_CHECKPOINT": "cp/env-placeholders"}


def pipeline_doc() -> dict[str, Any]:
    return {
        "pipeline_name": "env-placeholders",
        "sources": [{"name": "clicks", "kind": "files", "format": "parquet", "path": "${EMX_T_SOURCE_DIR}",
                     "schema": "user_id BIGINT, page STRING, amount BIGINT, ts TIMESTAMP",
                     "event_time_column": "ts"}],
        "transform": {
            "sql": "SELECT user_id, amount, _event_ts, _source FROM source WHERE page = '${EMX_T_WANTED_PAGE}'",
            "window": {"kind": "tumbling", "duration_ms": 60_000, "group_by": ["user_id"],
                       "max_groups_per_window": 1_000,
                       "aggregations": [{"agg": "count", "as": "n"},
                                        {"agg": "sum", "column": "amount", "as": "total"}]},
        },
        "target": {"kind": "parquet", "path": "${EMX_T_TARGET_DIR}"},
        "dead_letter": {"kind": "parquet", "path": "${EMX_T_DLQ_DIR}"},
        "state_store": {"kind": "sqlite", "path": "${EMX_T_STATE_DB}"},
        "run": {"checkpoint_location": "${EMX_T_CHECKPOINT}", "end_of_input": "flush"},
    }


def events() -> list[dict[str, Any]]:
    rng = random.Random(7)
    rows = [{"user_id": rng.randint(1, 4), "page": rng.choice(PAGES), "amount": rng.randint(1, 100),
             "ts": START + dt.timedelta(seconds=rng.uniform(0, 240))} for _ in range(120)]
    # no event time: never reach the SQL, dead-lettered as invalid_event_time
    rows += [{"user_id": 9, "page": WANTED, "amount": 1, "ts": None} for _ in range(3)]
    return rows


def expected_windows(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The ground truth, straight from the rows: WHERE page = WANTED, tumbling minutes per user."""
    df = pd.DataFrame(rows)
    df = df[df["ts"].notna() & (df["page"] == WANTED)].copy()
    df["window_start"] = pd.to_datetime(df["ts"], utc=True).dt.floor("60s")
    out = df.groupby(["window_start", "user_id"]).agg(n=("amount", "size"), total=("amount", "sum")).reset_index()
    return out.sort_values(["window_start", "user_id"]).reset_index(drop=True)


def read_dirs(path: Path) -> pd.DataFrame:
    files = sorted(path.glob("batch_id=*/*.parquet"))
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True) if files else pd.DataFrame()


class Ran:
    def __init__(self, root: Path, spec: PipelineSpec, rows: list[dict[str, Any]]) -> None:
        self.root, self.spec, self.rows = root, spec, rows

    def place(self, variable: str) -> Path:
        return self.root / PLACES[variable]


@pytest.fixture(scope="module")
def ran(spark, tmp_path_factory) -> Iterator[Ran]:
    from ematix_dagster.spark.runner import PipelineRunner

    root = tmp_path_factory.mktemp("env-placeholders")
    with pytest.MonkeyPatch.context() as mp:
        for variable, place in PLACES.items():
            mp.setenv(variable, str(root / place))
        mp.setenv("EMX_T_WANTED_PAGE", WANTED)
        mp.chdir(root)  # a placeholder used literally (a relative path) would land here
        rows = events()
        (root / PLACES["EMX_T_SOURCE_DIR"]).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), root / PLACES["EMX_T_SOURCE_DIR"] / "part-0.parquet")
        spec = load_pipeline_str(tomli_w.dumps(pipeline_doc()))
        PipelineRunner(spec, spark=spark, metrics=StreamingMetrics(CollectorRegistry()),
                       progress=lambda _line: None).run()
        yield Ran(root, spec, rows)


# ---------------------------------------------------------------------------------------------
# Each location, resolved


def test_output_lands_in_the_resolved_target_directory(ran: Ran) -> None:
    assert list(ran.place("EMX_T_TARGET_DIR").glob("batch_id=*/*.parquet")), "no window output"


def test_the_source_was_read_from_the_resolved_path(ran: Ran) -> None:
    assert summary(ran.spec, windows=False)["counters"]["rows_consumed:clicks"] == len(ran.rows)


def test_dead_letters_land_in_the_resolved_directory(ran: Ran) -> None:
    dead = read_dirs(ran.place("EMX_T_DLQ_DIR"))
    assert list(dead["_reason"]) == ["invalid_event_time"] * 3
    assert set(dead["user_id"]) == {9}


def test_state_lives_in_the_resolved_sqlite_file_and_checkpoint(ran: Ran) -> None:
    assert ran.place("EMX_T_STATE_DB").is_file()
    assert (ran.place("EMX_T_CHECKPOINT") / "commits" / "0").is_file()
    report = check(ran.spec)  # the spec as loaded: operations resolve it themselves
    assert report.healthy, report.problems
    assert str(ran.place("EMX_T_STATE_DB")) in report.store
    assert report.record is not None and report.record.last_batch_id == 0


def test_no_directory_named_after_a_placeholder_exists(ran: Ran) -> None:
    literal = [p for p in ran.root.rglob("*") if "$" in p.name or "{" in p.name]
    assert literal == []
    assert not any("$" in p.name for p in Path.cwd().iterdir())


def test_the_sql_filter_compares_with_the_resolved_literal(ran: Ran) -> None:
    got = read_dirs(ran.place("EMX_T_TARGET_DIR"))
    assert set(got["_emit_kind"]) == {"final"}
    got["window_start"] = pd.to_datetime(got["window_start"], utc=True)
    got = got[["window_start", "user_id", "n", "total"]].sort_values(["window_start", "user_id"]).reset_index(drop=True)
    want = expected_windows(ran.rows)
    assert len(want) > 0
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_spec_dump_and_fingerprint_keep_the_placeholders(ran: Ran) -> None:
    dumped = dump_pipeline(ran.spec)
    for variable in [*PLACES, "EMX_T_WANTED_PAGE"]:
        assert f"${{{variable}}}" in dumped
    assert str(ran.root) not in dumped and WANTED not in dumped
    assert ran.spec.run.checkpoint_location == "${EMX_T_CHECKPOINT}"
    record = check(ran.spec).record
    assert record is not None and record.fingerprint == fingerprint(fingerprint_doc(ran.spec))


def test_fingerprint_and_code_version_hold_the_placeholder_not_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from ematix_dagster.dagster.pipeline import spec_code_version

    doc = pipeline_doc()
    doc["transform"]["window"]["aggregations"][1]["column"] = "${EMX_T_SUM_COLUMN}"
    monkeypatch.setenv("EMX_T_SUM_COLUMN", "price")
    for variable in PLACES:
        monkeypatch.setenv(variable, f"/data/{variable.lower()}")
    monkeypatch.setenv("EMX_T_WANTED_PAGE", WANTED)
    spec = load_pipeline_str(tomli_w.dumps(doc))
    fp_doc = json.dumps(fingerprint_doc(spec))
    assert "${EMX_T_SUM_COLUMN}" in fp_doc and "price" not in fp_doc
    assert spec.resolved().window.aggregations[1].column == "price"
    before = spec_code_version(spec), fingerprint(fingerprint_doc(spec))
    monkeypatch.setenv("EMX_T_SUM_COLUMN", "cost")
    monkeypatch.setenv("EMX_T_TARGET_DIR", "/elsewhere")
    again = load_pipeline_str(tomli_w.dumps(doc))
    assert (spec_code_version(again), fingerprint(fingerprint_doc(again))) == before


# ---------------------------------------------------------------------------------------------
# Loading: variables must be set; values are checked once resolved


@pytest.mark.parametrize(("variable", "key"), [
    ("EMX_T_SOURCE_DIR", "sources[0].path"),
    ("EMX_T_TARGET_DIR", "target.path"),
    ("EMX_T_DLQ_DIR", "dead_letter.path"),
    ("EMX_T_STATE_DB", "state_store.path"),
    ("EMX_T_CHECKPOINT", "run.checkpoint_location"),
    ("EMX_T_WANTED_PAGE", "transform.sql"),
])
def test_an_unset_variable_is_an_error_naming_the_key(monkeypatch: pytest.MonkeyPatch, variable: str,
                                                     key: str) -> None:
    for name in [*PLACES, "EMX_T_WANTED_PAGE"]:
        monkeypatch.setenv(name, "/x")
    monkeypatch.delenv(variable)
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_str(tomli_w.dumps(pipeline_doc()))
    assert info.value.key == key
    assert f"${{{variable}}}" in str(info.value) and f"export {variable}=" in str(info.value)


def test_every_unset_variable_is_named_in_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixing one variable and rerunning must not meet the next: the error names them all, with their keys."""
    for name in [*PLACES, "EMX_T_WANTED_PAGE"]:
        monkeypatch.setenv(name, "/x")
    monkeypatch.delenv("EMX_T_DLQ_DIR")
    monkeypatch.delenv("EMX_T_CHECKPOINT")
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_str(tomli_w.dumps(pipeline_doc()))
    text = str(info.value)
    uses = {"dead_letter.path": "${EMX_T_DLQ_DIR}", "run.checkpoint_location": "${EMX_T_CHECKPOINT}"}
    assert info.value.key in uses and text.startswith(f"{info.value.key}: uses {uses.pop(info.value.key)}")
    ((other, variable),) = uses.items()
    assert f"{other} uses {variable}" in text
    assert "export EMX_T_DLQ_DIR=" in text and "export EMX_T_CHECKPOINT=" in text
    assert "EMX_T_SOURCE_DIR" not in text and "EMX_T_WANTED_PAGE" not in text


def test_a_variable_unset_after_loading_fails_resolution_naming_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*PLACES, "EMX_T_WANTED_PAGE"]:
        monkeypatch.setenv(name, "/x")
    spec = load_pipeline_str(tomli_w.dumps(pipeline_doc()))
    monkeypatch.delenv("EMX_T_DLQ_DIR")
    with pytest.raises(PipelineConfigError) as info:
        spec.resolved()
    assert info.value.key == "dead_letter.path"


def postgres_doc(table: str, url: str = "postgresql://ematix@127.0.0.1:5432/ematix") -> str:
    doc = pipeline_doc()
    doc["target"] = {"kind": "postgres", "url": url, "table": table}
    return tomli_w.dumps(doc)


def test_a_table_built_from_a_variable_is_accepted_once_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*PLACES, "EMX_T_WANTED_PAGE"]:
        monkeypatch.setenv(name, "/x")
    monkeypatch.setenv("SCHEMA", "public")
    spec = load_pipeline_str(postgres_doc("${SCHEMA}.t"))
    assert spec.target.table == "${SCHEMA}.t"
    assert spec.resolved().target.table == "public.t"
    assert spec.resolved().resolved() == spec.resolved()


def test_a_resolved_value_that_breaks_a_rule_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [*PLACES, "EMX_T_WANTED_PAGE"]:
        monkeypatch.setenv(name, "/x")
    monkeypatch.setenv("SCHEMA", "a.b")
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_str(postgres_doc("${SCHEMA}.t"))
    assert info.value.key == "target.table" and "'a.b.t'" in str(info.value)
    monkeypatch.setenv("EMX_T_CHECKPOINT", "s3://bucket/cp")
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline_str(tomli_w.dumps(pipeline_doc()))
    assert info.value.key == "run.checkpoint_location"


# ---------------------------------------------------------------------------------------------
# Passwords typed into the file


SECRET = "hunter2-Zq9"


@pytest.mark.parametrize(("where", "url", "warned"), [
    ("target", f"postgresql://app:{SECRET}@db.internal:5432/ematix", True),
    ("target", f"host=db.internal dbname=ematix user=app password={SECRET}", True),
    ("target", f"postgresql://app@db.internal/ematix?sslmode=require&password={SECRET}", True),
    ("target", "postgresql://app:${EMX_T_PGPASSWORD}@db.internal/ematix", False),
    ("target", "${EMX_T_TARGET_URL}", False),
    ("target", "postgresql://app@db.internal/ematix", False),
    ("dead_letter", f"postgresql://app:{SECRET}@db.internal/ematix", True),
    ("state_store", f"postgresql://app:{SECRET}@db.internal/ematix", True),
    ("state_store", "postgresql://${EMX_T_PGUSER}:${EMX_T_PGPASSWORD}@db.internal/ematix", False),
])
def test_a_password_written_in_the_file_is_warned_about_without_showing_it(
        monkeypatch: pytest.MonkeyPatch, where: str, url: str, warned: bool) -> None:
    for name in [*PLACES, "EMX_T_WANTED_PAGE", "EMX_T_PGPASSWORD", "EMX_T_PGUSER"]:
        monkeypatch.setenv(name, "/x")
    monkeypatch.setenv("EMX_T_TARGET_URL", f"postgresql://app:{SECRET}@db.internal/ematix")
    doc = pipeline_doc()
    table = {"kind": "postgres", "url": url, "table": "public.t"}
    if where == "state_store":
        doc["state_store"] = {"kind": "postgres", "url": url}
    else:
        doc[where] = table
    spec = load_pipeline_str(tomli_w.dumps(doc))
    warnings = spec_warnings(spec)
    assert len(warnings) == int(warned)
    for line in warnings:
        assert line.startswith(f"{where}.url: ") and "environment variable" in line and "${PGPASSWORD}" in line
        assert SECRET not in line and "db.internal" not in line
    assert SECRET not in repr(spec.resolved())  # a resolved URL is not part of the spec's repr
