"""The JVM options of every Spark driver the tests start, and the class archive those drivers share.

Every driver (the test process's, each CLI run's, each ``dagster dev`` and Airflow task's: they inherit
the environment) gets them through ``SPARK_SUBMIT_OPTS``:

- C1 only and the serial collector: a test's JVM lives seconds to minutes, too short for C2's compiling
  to pay off (tests/README.md has the measurements).
- Spark's classes mapped from one archive (the JDK's class data sharing, ``-XX:SharedArchiveFile``)
  instead of loaded and verified from its jars: a CLI run's CPU went from about 14.5 to 10.5 s. The
  archive is made by a short pipeline run (``scripts/setup.sh --test`` runs ``python -m
  tests.jvm_options``; else in the background of the first test session), and kept in the user's
  cache for the next ones, under a name that changes with the JVM and Spark's jars. A
  driver started before it is ready, or with another class path (a ``SPARK_CONF_DIR`` of its own),
  runs without it. The JVM's ``cds`` log lines are off, so that neither case prints anything.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"
ROOT = Path(__file__).resolve().parent.parent
WEEK_S = 7 * 24 * 3600

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


def _archive_name() -> str:
    """Named for the JVM binary and Spark's jars (their folder too), the things the archive must match.
    Read without importing pyspark: this runs at every pytest start."""
    from importlib.metadata import version
    from importlib.util import find_spec

    home = os.environ.get("JAVA_HOME")
    java = (Path(home) / "bin" / "java" if home else Path(shutil.which("java") or "java")).resolve()
    spec = find_spec("pyspark")
    jars = Path(spec.origin if spec and spec.origin else ".").parent / "jars"
    stamp = (f"{java}:{java.stat().st_mtime_ns if java.exists() else 0}:{version('pyspark')}:{jars}:"
             f"{','.join(sorted(p.name for p in jars.glob('*.jar')))}")
    return f"spark-classes-{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.jsa"


class ClassArchive:
    """The archive in the user's cache, or the run that makes it (a run of this session's own)."""

    def __init__(self) -> None:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ematix-dagster-tests"
        self.path = cache / _archive_name()
        self._proc: subprocess.Popen | None = None
        self._publisher: threading.Thread | None = None
        self._directory: Path | None = None
        for other in cache.glob("spark-classes-*.jsa"):  # another venv's or JVM's, unused for a week
            if other != self.path and time.time() - other.stat().st_mtime > WEEK_S:
                other.unlink(missing_ok=True)
        if self.path.exists():
            os.utime(self.path)
            return
        cache.mkdir(parents=True, exist_ok=True)
        # written beside the archive and renamed when whole: no driver maps half a file
        self._partial = cache / f".{self.path.name}.{os.getpid()}"
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "SPARK_SUBMIT_OPTS": f"{JIT_OPTIONS} {QUIET_CDS} -XX:ArchiveClassesAtExit={self._partial}"}
        self._directory = Path(tempfile.mkdtemp(prefix="ematix-test-jvm-"))
        proc = self._proc = subprocess.Popen([sys.executable, "-c", _ARCHIVE_RUN, str(self._directory)], cwd=ROOT,
                                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def publish() -> None:
            if proc.wait() == 0 and self._partial.exists():
                os.replace(self._partial, self.path)

        self._publisher = threading.Thread(target=publish, daemon=True)
        self._publisher.start()

    def wait(self) -> bool:
        """Until the run that makes the archive has ended; whether the archive is there."""
        if self._proc is not None and self._publisher is not None:
            self._proc.wait()
            self._publisher.join()
        return self.path.exists()

    def spark_submit_opts(self) -> str:
        return f"{JIT_OPTIONS} {QUIET_CDS} -XX:SharedArchiveFile={self.path}"

    def close(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
            self._partial.unlink(missing_ok=True)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)


if __name__ == "__main__":  # scripts/setup.sh --test: the archive before the first test session needs it
    archive = ClassArchive()
    made = archive.wait()
    archive.close()
    sys.exit(0 if made else "error: the JVM did not write its class archive")
