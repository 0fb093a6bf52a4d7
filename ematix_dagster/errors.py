"""Exception types a user can catch.

Each failure is either *terminal* (the operator must act: a config error, a cap hit, a changed
spec) or *transient* (retrying may help: a database that is briefly unreachable, a Spark job that
died). Dagster and the CLI use ``terminal`` to decide whether a retry makes sense.

The store's errors and the base class live in the bottom layer (``state_store.errors``) and are
re-exported here as the same classes, so ``from ematix_dagster.errors import CorruptState`` and
``except ematix_dagster.errors.EmatixError`` see what ``state_store`` raises.
"""

from __future__ import annotations

from state_store.errors import (
    ConfigError,
    CorruptState,
    EmatixError,
    LeaseHeld,
    LeaseLost,
    StateVersionError,
    StoreAccessDenied,
    StoreConfigError,
    StorePermissionError,
    StoreUnavailable,
)


def first_line(exc: BaseException) -> str:
    """The headline of an exception (Spark's messages run to pages of JVM stack)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class PipelineConfigError(ConfigError):
    """A pipeline spec that cannot run: names the key, the bad value and the fix."""


class StateCapExceeded(EmatixError):
    """``max_groups_per_window`` or ``max_distinct_values_per_group`` was reached."""


class AggregationOverflow(EmatixError):
    """An integer sum left the BIGINT range."""


class StateNotDurableError(EmatixError):
    """A restart would silently lose in-memory window state."""


class TargetError(EmatixError):
    """A target or dead-letter write failed; retrying may help."""

    terminal = False


class FingerprintChanged(EmatixError):
    """The state-relevant part of the spec changed since the state was written."""


class SparkQueryFailed(EmatixError):
    """The streaming query died for a reason outside the engine (a Spark job failure)."""

    terminal = False


class UnexpectedError(EmatixError):
    """A failure no rule classifies (a bug, or an environment problem this code does not know).

    Terminal: retrying in a loop would only repeat it; the message and the traceback say what
    happened.
    """


class CheckpointDiverged(EmatixError):
    """Spark's checkpoint and the state store disagree about where the pipeline is."""


class InputSchemaMismatch(EmatixError):
    """An input file does not fit the source's declared schema (a CSV header naming other columns,
    a Parquet column of another type). Terminal: the same file fails the same way on every retry."""


class BatchDataError(EmatixError):
    """A batch's Spark job failed on a value in its input (SQLSTATE class 22, a data exception: an
    overflow or a cast the guarded ``[transform] sql`` cannot catch). Terminal: a replay reads the
    same rows and fails the same way; the message names the batch's files or offsets."""


class UnreadableInputFile(EmatixError):
    """An input file that cannot be read: truncated, not in its format, corrupt inside.

    Terminal: the same bytes fail the same way on every retry. ``on_unreadable_file = "skip"`` on
    the source leaves such files out instead (counted and dead-lettered).
    """


class BackfillRefused(ConfigError):
    """A backfill that cannot run as asked (a range the streaming state still holds, one before
    ``[backfill] start`` or not cut at partition boundaries): nothing ran. ``key`` names the
    option at fault (``--from``, ``--to``); exit code 2, like a configuration error."""


class BackfillBusy(EmatixError):
    """Another backfill of the pipeline holds its backfill lock. Retrying once it ended may help."""

    terminal = False


class SourceUnavailable(EmatixError):
    """A message broker (Redis) did not answer while the query planned or read a batch. Transient:
    nothing was committed for the batch, so a retry once the broker is back reads it again."""

    terminal = False


class SourceAccessDenied(EmatixError):
    """A message broker refused the pipeline's credentials. Terminal: fix the password it names."""


class SourceConnectorMissing(EmatixError):
    """Spark has no connector for a source's kind (the Kafka source without spark-sql-kafka on the
    classpath). Terminal: nothing is downloaded at run time, so a retry finds it missing again."""


class SourceTrimmed(EmatixError):
    """Entries after the pipeline's stored offset are gone from the stream (trimmed or deleted).
    Terminal: they stay gone; ``on_trimmed = "skip"`` goes on without them (counted)."""


class CorruptCheckpoint(EmatixError):
    """A file in Spark's checkpoint directory is not in Spark's format (offsets, commits, metadata).

    Terminal: the file reads the same on every retry; restore the checkpoint or reset.
    """


__all__ = ["AggregationOverflow", "BackfillBusy", "BackfillRefused", "BatchDataError", "CheckpointDiverged", "ConfigError", "CorruptCheckpoint", "CorruptState",
           "EmatixError", "FingerprintChanged", "InputSchemaMismatch", "LeaseHeld", "LeaseLost", "PipelineConfigError",
           "SourceAccessDenied", "SourceConnectorMissing", "SourceTrimmed", "SourceUnavailable", "SparkQueryFailed", "StateCapExceeded", "StateNotDurableError", "StateVersionError",
           "StoreAccessDenied", "StoreConfigError", "StorePermissionError", "StoreUnavailable", "TargetError",
           "UnexpectedError", "UnreadableInputFile", "first_line"]
