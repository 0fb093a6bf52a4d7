"""Corrupt Spark checkpoint files end as terminal ``CorruptCheckpoint``s that name the file, never as raw tracebacks.
Checkpoint files are damaged on disk; no Spark is started.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable

import pytest

from ematix_dagster.errors import CorruptCheckpoint, CorruptState
from ematix_dagster.operations import check
from ematix_dagster.spark.input import checkpoint
from tests.e2e.corrupt_state_setup import (  # noqa: F401 - setup_fixture is the setup fixture
    GOOD,
    INTEGRAL,
    OFFSET,
    PIPELINE,
    QUERY_ID,
    Setup,
    _terminal,
    _with,
    setup_fixture,
)

# ---- 4. Spark checkpoint files --------------------------------------------------------------------

CHECKPOINT_FILES: list[tuple[str, str, bytes, Callable[[str], Any], str]] = [
    # (case id, file, content, reader, fragment)
    ("offsets-empty", "offsets/0", b"", lambda cp: checkpoint.read_offsets(cp, 0), "empty"),
    ("offsets-version-only", "offsets/0", b"v1\n", lambda cp: checkpoint.read_offsets(cp, 0), "line 2"),
    ("offsets-bad-version", "offsets/0", b'{"batchTimestampMs":1}\n{}\n{}\n',
     lambda cp: checkpoint.read_offsets(cp, 0), "log version"),
    ("offsets-metadata-not-json", "offsets/0", b"v1\n{batchTimestampMs: 1}\n" + OFFSET.encode(),
     lambda cp: checkpoint.read_offsets(cp, 0), "not JSON"),
    ("offsets-no-timestamp", "offsets/0", b'v1\n{"batchWatermarkMs":0}\n' + OFFSET.encode(),
     lambda cp: checkpoint.read_offsets(cp, 0), "batchTimestampMs"),
    ("offsets-text-timestamp", "offsets/0", b'v1\n{"batchTimestampMs":"now"}\n' + OFFSET.encode(),
     lambda cp: checkpoint.read_offsets(cp, 0), "batchTimestampMs"),
    ("offsets-no-source-offsets", "offsets/0", b'v1\n{"batchTimestampMs":1}\n',
     lambda cp: checkpoint.read_offsets(cp, 0), "no source offsets"),
    ("offsets-binary", "offsets/0", b"\xff\xfe\x00garbage", lambda cp: checkpoint.read_offsets(cp, 0), "UTF-8"),
    ("metadata-empty", "metadata", b"", checkpoint.query_id, "line 1"),
    ("metadata-not-json", "metadata", b"id=abc\n", checkpoint.query_id, "not JSON"),
    ("metadata-array", "metadata", b'["abc"]\n', checkpoint.query_id, "query id"),
    ("metadata-no-id", "metadata", b'{"name":"q"}\n', checkpoint.query_id, "query id"),
    ("source-log-not-json", "sources/0/0", b"v1\nnot json\n", lambda cp: checkpoint.source_log(cp, 0, 0), "not JSON"),
]


@pytest.mark.parametrize("name,content,read,fragment",
                         [pytest.param(n, c, r, f, id=i) for i, n, c, r, f in CHECKPOINT_FILES])
def test_garbage_checkpoint_file_is_corrupt_checkpoint(tmp_path, name, content, read, fragment):
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    (cp / "offsets" / "0").write_text('v1\n{"batchTimestampMs":1700000000000}\n' + OFFSET + "\n")
    (cp / "commits" / "0").write_text("v1\n{}\n")
    (cp / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    path = cp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpoint) as info:
        read(str(cp))
    text = _terminal(info.value)
    assert str(path) in text and fragment in text, text
    assert f"Restore the checkpoint directory {cp}" in text and "reset PIPELINE.toml --yes" in text


def test_spark_format_checkpoint_reads(tmp_path):
    """The control: Spark's own files read as before; its .crc / .tmp files and stray names are ignored."""
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    for batch in (0, 1, 10):
        (cp / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":%d,"conf":{"k":"v"}}\n{"logOffset":%d}\n-\n'
            % (1700000000000 + batch, batch))
        (cp / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        (cp / "commits" / f".{batch}.crc").write_bytes(b"\x00")
    (cp / "offsets" / f".11.{uuid.uuid4()}.tmp").write_text("half written")
    for stray in ("commits/1.bak", "commits/\u00b2", "offsets/latest"):  # ignored, as Spark ignores them
        (cp / stray).write_text("v1\n")
    (cp / "metadata").write_text(json.dumps({"id": QUERY_ID}))
    loc = f"file://{cp}"
    assert checkpoint.read_offsets(loc, 10) == checkpoint.BatchOffsets(10, 1700000000010, ('{"logOffset":10}', "-"))
    assert checkpoint.committed_batches(loc) == [0, 1, 10]
    assert checkpoint.has_progress(loc) is True
    assert checkpoint.query_id(loc) == QUERY_ID
    assert checkpoint.committed_batches(str(tmp_path / "missing")) == []
    assert checkpoint.query_id(str(tmp_path / "missing")) is None


def test_check_reports_corrupt_checkpoint(setup):
    setup.write()
    assert check(setup.spec).healthy
    (setup.tmp / "cp" / "offsets" / "0").write_text("v1\n")
    report = check(setup.spec)
    assert [p.code for p in report.problems] == ["corrupt_checkpoint"], [str(p) for p in report.problems]
    problem = report.problems[0]
    assert str(setup.tmp / "cp" / "offsets" / "0") in problem.message
    assert "backup" in problem.fix and "reset PIPELINE.toml --yes" in problem.fix


def test_check_groups_vets_decoded_state_before_spark_knows_the_column_types(tmp_path, request):
    """``check_groups`` (for a run's preflight and for ``check``): no Spark, so sums may be int, float or decimal."""
    from ematix_dagster.streaming.kinds.kind_state import StoredGroup
    from ematix_dagster.streaming.micro_batch import check_groups

    window = Setup("sqlite", tmp_path, request).spec.window
    good = [StoredGroup(start, None, key, accs) for (start, key), accs in GOOD.items()]
    check_groups(PIPELINE, window, good)
    float_sum = StoredGroup(0, None, ("d",), _with(1, 4.5))
    check_groups(PIPELINE, window, good + [float_sum])  # a float sum: the column type is unknown
    for thorough in (False, True):
        with pytest.raises(CorruptState) as info:
            check_groups(PIPELINE, window, good + [StoredGroup(0, None, ("d",), _with(2, (7.5, 3, 1)))], "the store",
                         thorough=thorough)
        text = _terminal(info.value)
        assert "pipeline 'corrupt-inputs' in the store" in text and "('d',)" in text and "'mean' (avg)" in text
    with pytest.raises(CorruptState):
        check_groups(PIPELINE, window, good + [float_sum], integral=INTEGRAL)
