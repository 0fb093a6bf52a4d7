"""The local SparkSession every run and test shares.

Spark binds to 127.0.0.1 with its UI off (docs/contract/operations.md), works in UTC and uses few shuffle
partitions: on a small machine the default 200 costs ~10x in scheduling (docs/design.md).

Against a cluster master (``spark://``, ``yarn``, ``k8s://``) the driver is not pinned to
127.0.0.1: executors on other hosts must reach it, so its address comes from Spark's own
settings (``SPARK_LOCAL_IP``, ``spark.driver.host`` in ``spark-defaults.conf`` or ``conf``).
"""

from __future__ import annotations

import logging
import os
import sys

from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

#: Only for ``local[...]`` masters: a driver bound to loopback is unreachable from remote executors.
LOCAL_CONF: dict[str, str] = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    # Spark writes a batch's offsets and commit files through Hadoop's FileContext by default, which
    # without Hadoop's native library (pyspark ships none) runs `readlink` as a child process several
    # times for each file it renames. Hadoop's FileSystem writes the same temporary file and renames
    # it without them (about 10% less CPU for a small streaming run); a rename on one machine's disk
    # is atomic. Cluster masters keep Spark's default.
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.log.level": "WARN",
    # PySpark 4 records a Python call site on every Column call (several JVM round trips each);
    # the per-batch plan makes ~1,000 such calls, so this halves the driver's planning CPU.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}


#: PySpark's loggers that print an analysis error with a query context (a user's SQL that does not
#: analyse) as a JSON line with the whole JVM stack, before raising it: the engine reports that
#: error itself, once and without the stack (``ematix-dagster validate``, a pipeline's start)
QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def get_spark(app_name: str = "ematix-dagster", master: str | None = None,
              conf: dict[str, str] | None = None) -> SparkSession:
    """Return the active session or build a local one with our defaults.

    ``conf`` overrides the defaults (a Dagster resource passes its own); ``EMATIX_SPARK_MASTER``
    overrides ``local[2]``. Only a local master binds the driver to 127.0.0.1 (:data:`LOCAL_CONF`).
    """
    master = master or os.environ.get("EMATIX_SPARK_MASTER") or "local[2]"
    builder = SparkSession.builder.appName(app_name).master(master)
    local = master.strip().lower().startswith("local")
    local_conf = LOCAL_CONF if local else {}
    if local:
        # Python workers (a Python data source such as redis_stream plans and reads in them) run
        # "python3" from PATH unless told otherwise, which lacks this package's dependencies.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in {**local_conf, **DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # A session created elsewhere keeps its own settings; these two the engine relies on.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    for name in QUERY_CONTEXT_LOGGERS:  # made as PySpark makes them: it logs to them with its own fields
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)
    return spark
