"""Helpers of the end-to-end window tests (tests/e2e/test_windows.py, test_window_caps.py,
test_window_kind_contract.py): time, pipeline TOML, reading targets, and the ground truth (window assignment +
pandas groupby, independent of the engine).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ematix_dagster.spark.input.checkpoint import source_log
from ematix_dagster.spark.runner import PipelineRunner
from ematix_dagster.spec import load_pipeline_str

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
T0 = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)  # a minute boundary
T0_US = (T0 - EPOCH) // dt.timedelta(microseconds=1)
S = 1_000_000  # microseconds per second
TS_TYPE = pa.timestamp("us", tz="UTC")


# ---------------------------------------------------------------------------------------------
# Helpers: time, TOML, reading targets


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def to_us(value: dt.datetime) -> int:
    return (value - EPOCH) // dt.timedelta(microseconds=1)


def iso(us: int) -> str:
    return dt.datetime.fromtimestamp(us / S, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def agg_toml(aggs: Sequence[dict[str, Any]]) -> str:
    out = []
    for a in aggs:
        lines = ["[[transform.window.aggregations]]"]
        for k, v in a.items():
            lines.append(f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v}")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def pipeline(name: str, source_dir: Path, schema: str, checkpoint: Path, window: str,
             aggs: Sequence[dict[str, Any]], target: str, max_files: int = 1, end_of_input: str = "flush") -> str:
    return f"""
pipeline_name = "{name}"

[[sources]]
name = "clicks"
kind = "files"
format = "parquet"
path = "{source_dir}"
schema = "{schema}"
event_time_column = "ts"
max_files_per_trigger = {max_files}

[transform.window]
{window}

{agg_toml(aggs)}

[target]
{target}

[run]
checkpoint_location = "{checkpoint}"
end_of_input = "{end_of_input}"

[state_store]
kind = "sqlite"
path = "{checkpoint}-state.db"
"""


def parquet_target(path: Path) -> str:
    return f'kind = "parquet"\npath = "{path}"'


def run(toml: str, spark) -> Any:
    spec = load_pipeline_str(toml)
    lines: list[str] = []
    return PipelineRunner(spec, spark=spark, progress=lines.append).run()


def read_parquet_target(path: Path, start_col: str, end_col: str, group_by: Sequence[str]) -> dict[tuple, dict]:
    """All rows of a parquet target, the latest ``batch_id`` per (window start, group) key.

    Also checks that every row is a ``final`` and that no key was emitted twice (rows arrive in
    order, so there is nothing to correct).
    """
    table = pq.read_table(path)
    rows = table.to_pylist()
    for r in rows:
        r["batch_id"] = int(r["batch_id"])
    rows.sort(key=lambda r: r["batch_id"])
    out: dict[tuple, dict] = {}
    for r in rows:
        assert r["_emit_kind"] == "final", r
        start, end = to_us(r[start_col]), to_us(r[end_col])
        key = (start, *(r[g] for g in group_by))
        assert key not in out, f"window/group {key} emitted twice"
        r[start_col], r[end_col] = start, end
        out[key] = r
    return out


# ---------------------------------------------------------------------------------------------
# Ground truth: window assignment + pandas groupby, independent of the engine


def window_starts(t_us: int, duration_us: int, hop_us: int) -> list[int]:
    """Every multiple of the hop in (t - D, t], found by walking down from the latest start."""
    s = (t_us // hop_us) * hop_us
    starts = []
    while s > t_us - duration_us:
        starts.append(s)
        s -= hop_us
    return sorted(starts)


def _null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _values(g: pd.DataFrame, col: str) -> list[Any]:
    return [v for v in g[col].tolist() if not _null(v)]


def _first_last(g: pd.DataFrame, col: str, last: bool) -> Any:
    pairs = [(t, v) for t, v in zip(g["_t"].tolist(), g[col].tolist()) if not _null(v)]
    if not pairs:
        return None
    pairs.sort()  # event time, then the value: first = smallest, last = largest
    return pairs[-1][1] if last else pairs[0][1]


AGG_TRUTH: dict[str, Callable[[pd.DataFrame, str | None], Any]] = {
    "count": lambda g, c: len(g),
    "count_col": lambda g, c: len(_values(g, c)),
    "sum": lambda g, c: sum(_values(g, c)) if _values(g, c) else None,
    "min": lambda g, c: min(_values(g, c)) if _values(g, c) else None,
    "max": lambda g, c: max(_values(g, c)) if _values(g, c) else None,
    "avg": lambda g, c: sum(_values(g, c)) / len(_values(g, c)) if _values(g, c) else None,
    "first": lambda g, c: _first_last(g, c, last=False),
    "last": lambda g, c: _first_last(g, c, last=True),
    "count_distinct": lambda g, c: len(set(_values(g, c))),
}


def ground_truth(events: list[dict], duration_s: int, hop_s: int, group_by: Sequence[str],
                 aggs: Sequence[dict[str, Any]], emitted_up_to_us: int | None = None) -> dict[tuple, dict]:
    """{(window start us, *group key): {"end": us, alias: value}} for windows with end <= bound."""
    exploded = []
    for e in events:
        t = to_us(e["ts"])
        for s in window_starts(t, duration_s * S, hop_s * S):
            exploded.append({**e, "_t": t, "_ws": s})
    cols = list(exploded[0])
    df = pd.DataFrame({c: pd.Series([r[c] for r in exploded], dtype=object) for c in cols})
    truth: dict[tuple, dict] = {}
    for _, g in df.groupby(["_ws", *group_by], dropna=False, sort=False):
        # the key as the original Python values (pandas may turn object keys into floats)
        key = tuple(None if _null(v) else v for v in (g[c].iloc[0] for c in ["_ws", *group_by]))
        start = int(key[0])
        end = start + duration_s * S
        if emitted_up_to_us is not None and end > emitted_up_to_us:
            continue
        truth[(start, *key[1:])] = {"end": end, **{a["as"]: AGG_TRUTH[a["agg"]](g, a.get("column")) for a in aggs}}
    return truth


def assert_rows_match(actual: dict[tuple, dict], truth: dict[tuple, dict], aggs: Sequence[dict[str, Any]],
                      end_col: str, approx_distinct: float = 0.0) -> None:
    assert sorted(actual, key=repr) == sorted(truth, key=repr), "emitted (window, group) keys differ"
    for key, want in truth.items():
        got = actual[key]
        assert got[end_col] == want["end"], key
        for a in aggs:
            alias, g, w = a["as"], got[a["as"]], want[a["as"]]
            where = f"{alias} of {key} ({iso(key[0])})"
            if a["agg"] == "count_distinct" and a.get("mode", "approximate") == "approximate" and approx_distinct:
                assert abs(g - w) <= approx_distinct * w, f"{where}: {g} vs exact {w}"
            elif isinstance(w, float):
                assert g == pytest.approx(w, rel=1e-12, abs=1e-12), where
            else:
                assert g == w and type(g) is type(w), f"{where}: got {g!r}, want {w!r}"


def assert_source_log(checkpoint: Path, files: Sequence[Sequence[Path]]) -> None:
    """Micro-batch N read exactly the files ``files[N]`` (Spark's ``sources/0/N`` log)."""
    for n, expected in enumerate(files):
        logged = source_log(str(checkpoint), 0, n)
        assert sorted(Path(re.sub(r"^file:(//)?", "", p)).resolve() for p in logged) == \
            sorted(Path(p).resolve() for p in expected), f"batch {n} read {logged}"
    assert source_log(str(checkpoint), 0, len(files)) == []
