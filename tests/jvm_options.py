"""The JVM options of every Spark driver the tests start, and the class archive those drivers share.

Every driver (the test process's, each CLI run's, each ``dagster dev`` and Airflow task's: they inherit
the environment) gets them through ``SPARK_SUBMIT_OPTS``:

- C1 only and the serial collector: a test's JVM lives seconds to minutes, too short for C2's compiling
  to pay off (tests/README.md has the measurements).
- Spark's classes mapped from one archive (the JDK's class data sharing, ``-XX:SharedArchiveFile``)
  instead of loaded and verified from its jars: a CLI run's CPU went from about 14.5 to 10.5 s. The
  archive is made once per test session, by a short pipeline run in the background; a driver started
  before it is ready, or with another class path (a ``SPARK_CONF_DIR`` of its own), runs without it.
  The JVM's ``cds`` log lines are off, so that neither case prints anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"
ROOT = Path(__file__).resolve().parent.parent

#: a run of a small windowed pipeline through the CLI, then the JVM's exit, at which it writes the archive
_ARCHIVE_RUN = """
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import SparkContext

from ematix_dagster import cli
from tests.pipeline_toml import windowed_pipeline_toml

root = Path(sys.argv[1])
(root / "in").mkdir()
rows = [{"id": i, "k": f"k{i % 3}", "v": i, "page": "p", "ts": 1_700_000_000_000_000 + i * 10**7} for i in range(30)]
schema = pa.schema([("id", pa.int64()), ("k", pa.string()), ("v", pa.int64()), ("page", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])
pq.write_table(pa.Table.from_pylist(rows, schema), root / "in" / "a.parquet")
toml = root / "archive.toml"
toml.write_text(windowed_pipeline_toml("archive", root, trigger="available_now", end_of_input="flush"))
assert cli.main(["run", str(toml)]) == 0
gateway = SparkContext._gateway
SparkContext._active_spark_context.stop()
gateway.shutdown()
gateway.proc.stdin.close()  # the JVM exits on its stdin's end and writes the archive
sys.exit(gateway.proc.wait())
"""


class ClassArchive:
    """A directory of the session's own, with the archive once its pipeline run has written it."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="ematix-test-jvm-"))
        self.path = self.directory / "spark-classes.jsa"
        partial = self.directory / "spark-classes.jsa.part"  # renamed when whole: no driver maps half a file
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "SPARK_SUBMIT_OPTS": f"{JIT_OPTIONS} {QUIET_CDS} -XX:ArchiveClassesAtExit={partial}"}
        run_dir = self.directory / "run"
        run_dir.mkdir()
        self._proc = subprocess.Popen([sys.executable, "-c", _ARCHIVE_RUN, str(run_dir)], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def publish() -> None:
            if self._proc.wait() == 0 and partial.exists():
                os.replace(partial, self.path)

        threading.Thread(target=publish, daemon=True).start()

    def spark_submit_opts(self) -> str:
        return f"{JIT_OPTIONS} {QUIET_CDS} -XX:SharedArchiveFile={self.path}"

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
