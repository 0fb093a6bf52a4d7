"""The parquet and console window writers, on real parquet files (no mocks)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ematix_dagster.errors import PipelineConfigError
from ematix_dagster.spec import Target
from ematix_dagster.targets import make_window_writer
from tests.targets.writer_tables import PIPE, SIMPLE, SIMPLE_KEY, TS, batch, ts

# ---------------------------------------------------------------------------------------------
# parquet and console targets


def read_batch_dir(path: Path) -> pd.DataFrame:
    return pq.read_table(path / "part-0.parquet").to_pandas()


def test_parquet_target_batches_replace_on_replay(tmp_path):
    root = tmp_path / "out"
    w = make_window_writer(Target(kind="parquet", path=str(root)), PIPE, SIMPLE, SIMPLE_KEY)
    assert w.idempotent and str(root) in w.description
    w.open()
    w.write(0, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 1, 1.0, "final"), (ts(0), ts(1), None, None, 2, None, "final")]))
    w.write(1, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 2, 2.0, "correction")]))
    w.write(2, batch(SIMPLE, []))  # empty: nothing written
    # Replay batch 1 (with different content, to see the replacement).
    w.write(1, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 3, 3.0, "correction"), (ts(1), ts(2), 2, "b", 1, 0.0, "final")]))
    w.close()

    assert sorted(p.name for p in root.iterdir()) == ["batch_id=0", "batch_id=1"]  # no temp dirs left
    assert [p.name for p in (root / "batch_id=1").iterdir()] == ["part-0.parquet"]
    b0 = read_batch_dir(root / "batch_id=0")
    assert list(b0.columns) == SIMPLE.names
    assert b0["_emit_kind"].tolist() == ["final", "final"]
    assert b0["user_id"].isna().tolist() == [False, True]
    b1 = read_batch_dir(root / "batch_id=1")
    assert b1[["user_id", "n", "_emit_kind"]].values.tolist() == [[1, 3, "correction"], [2, 1, "final"]]
    assert pq.read_schema(root / "batch_id=1" / "part-0.parquet").field("window_start").type == TS

    # The whole output read as a dataset: latest row per key = highest batch id.
    ds = pq.read_table(root).to_pandas()
    assert len(ds) == 4 and set(ds["batch_id"].astype(int)) == {0, 1}


def test_parquet_open_removes_files_a_crash_left_half_written(tmp_path):
    root = tmp_path / "out"
    w = make_window_writer(Target(kind="parquet", path=f"file://{root}"), PIPE, SIMPLE, SIMPLE_KEY)
    w.open()
    w.write(7, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 1, 1.0, "final")]))
    # A crash while writing leaves a hidden temporary file; the complete file is untouched.
    (root / "batch_id=7" / ".part-0.parquet.tmp-abc123").write_bytes(b"PAR1 half")
    w2 = make_window_writer(Target(kind="parquet", path=str(root)), PIPE, SIMPLE, SIMPLE_KEY)
    w2.open()
    assert sorted(p.name for p in (root / "batch_id=7").iterdir()) == ["part-0.parquet"]
    assert read_batch_dir(root / "batch_id=7")["n"].tolist() == [1]


def test_a_failed_replay_of_a_parquet_batch_leaves_the_earlier_file_whole(tmp_path):
    """Arrow refuses the replay's rows after the temporary file was opened: the earlier attempt's
    file stays as it was, the temporary file goes, and the next attempt replaces the file."""
    root = tmp_path / "out"
    w = make_window_writer(Target(kind="parquet", path=str(root)), PIPE, SIMPLE, SIMPLE_KEY)
    w.open()
    w.write(4, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 1, 1.0, "final")]))
    unwritable = pa.table({"span": pa.array([pa.MonthDayNano([0, 1, 0])], type=pa.month_day_nano_interval())})
    with pytest.raises(pa.ArrowNotImplementedError):
        w.write(4, unwritable)
    assert sorted(p.name for p in (root / "batch_id=4").iterdir()) == ["part-0.parquet"]
    assert read_batch_dir(root / "batch_id=4")["n"].tolist() == [1]
    w.write(4, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 2, 1.0, "final")]))
    assert sorted(p.name for p in (root / "batch_id=4").iterdir()) == ["part-0.parquet"]
    assert read_batch_dir(root / "batch_id=4")["n"].tolist() == [2]


def test_parquet_parts_of_one_batch_are_replaced_separately(tmp_path):
    root = tmp_path / "out"
    w = make_window_writer(Target(kind="parquet", path=str(root)), PIPE, SIMPLE, SIMPLE_KEY)
    w.open()
    w.write(3, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 1, 1.0, "final")]))
    w.write(3, batch(SIMPLE, [(ts(1), ts(2), 1, "a", 5, 2.0, "final")]), part="flush")
    w.write(3, batch(SIMPLE, [(ts(0), ts(1), 1, "a", 2, 1.0, "final")]))  # a replay of batch 3
    assert sorted(p.name for p in (root / "batch_id=3").iterdir()) == ["flush.parquet", "part-0.parquet"]
    both = pd.concat([pq.read_table(f).to_pandas() for f in sorted((root / "batch_id=3").glob("*.parquet"))])
    assert sorted(both["n"].tolist()) == [2, 5]


def test_remote_parquet_path_is_refused(tmp_path):
    with pytest.raises(PipelineConfigError, match="local"):
        make_window_writer(Target(kind="parquet", path="s3://bucket/x"), PIPE, SIMPLE, SIMPLE_KEY)


def test_console_target_prints_each_batch(capsys):
    w = make_window_writer(Target(kind="console"), PIPE, SIMPLE, SIMPLE_KEY)
    assert w.idempotent is False
    w.open()
    w.write(3, batch(SIMPLE, [(ts(0), ts(1), 1, "home", 4, 2.5, "final"), (ts(0), ts(1), None, None, 1, None, "final")]))
    w.write(4, batch(SIMPLE, []))
    w.close()
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "-- batch 3: 2 windows --"
    assert lines[1].split() == ["window_start", "window_end", "user_id", "page", "n", "amount_sum", "_emit_kind"]
    assert "home" in lines[2] and "2024-05-01 12:00:00+00:00" in lines[2] and "final" in lines[2]
    assert len(lines) == 4  # nothing for the empty batch


def test_parquet_dictionary_encodes_strings_only(tmp_path):
    # group keys and kinds repeat; window bounds, counts and sums mostly do not
    w = make_window_writer(Target(kind="parquet", path=str(tmp_path)), PIPE, SIMPLE, SIMPLE_KEY)
    w.open()
    rows = [(ts(i), ts(i + 1), i % 3, "abc"[i % 3], i, i / 2, "final") for i in range(50)]
    w.write(0, batch(SIMPLE, rows))
    meta = pq.ParquetFile(tmp_path / "batch_id=0" / "part-0.parquet").metadata.row_group(0)
    dictionary = {meta.column(i).path_in_schema for i in range(meta.num_columns)
                  if any("DICTIONARY" in e for e in meta.column(i).encodings)}
    strings = {f.name for f in SIMPLE if str(f.type) == "string"}
    assert strings and dictionary == strings
    assert read_batch_dir(tmp_path / "batch_id=0").to_dict("records") == batch(SIMPLE, rows).to_pandas().to_dict("records")
