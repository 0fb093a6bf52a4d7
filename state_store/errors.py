"""The error types of the state store, and the base class of every error this project raises.

``state_store`` is the bottom layer: it defines these and imports nothing of ``ematix_dagster``,
which re-exports them (``ematix_dagster.errors.CorruptState is state_store.errors.CorruptState``)
and adds the pipeline's own errors on top of ``EmatixError``.

Each failure is either *terminal* (the operator must act: a config error, a cap hit, a changed
spec) or *transient* (retrying may help: a database that is briefly unreachable, a Spark job that
died). Dagster and the CLI use ``terminal`` to decide whether a retry makes sense.
"""

from __future__ import annotations

#: The way out of state that cannot be used, as the stores and the engine say it.
RESTORE_OR_RESET = ("Restore the state store from a backup, or start over with "
                    "`ematix-dagster reset PIPELINE.toml --yes`")


class EmatixError(Exception):
    """Base class of every error this package raises on purpose.

    ``way_out`` (what the operator can do about it) is kept apart from ``cause`` (what is wrong),
    so a report such as ``ematix-dagster check`` can state the cause and give its own advice
    without cutting the message apart; ``str()`` is both.
    """

    terminal: bool = True
    #: a file holding the failure's full report (Spark's stack), written there instead of printed
    stack_file: str | None = None

    def __init__(self, *args: object, way_out: str | None = None) -> None:
        self.cause = str(args[0]) if args else ""
        self.way_out = way_out
        if way_out is not None:
            args = (f"{self.cause.rstrip('.')}. {way_out}", *args[1:])
        super().__init__(*args)


class ConfigError(EmatixError, ValueError):
    """A setting that cannot work: names the key, the bad value and the fix.

    Terminal, and raised before anything ran. The CLI exits 2 for every ``ConfigError``: the
    pipeline's (``ematix_dagster.errors.PipelineConfigError``) and the store's
    (:class:`StoreConfigError`).
    """

    def __init__(self, key: str, message: str, fix: str | None = None) -> None:
        self.key = key
        self.fix = fix
        text = f"{key}: {message}"
        if fix:
            text += f" (fix: {fix})"
        super().__init__(text)


class StoreConfigError(ConfigError):
    """A store setting that cannot work (an empty schema name, a URL that does not parse)."""


class StoreUnavailable(EmatixError):
    """The state store cannot be reached (down, restarting, network); retrying may help."""

    terminal = False


class StoreAccessDenied(EmatixError):
    """The database refused the credentials, or the role or database does not exist.

    Terminal: retrying with the same settings fails the same way until someone acts.
    """


class StorePermissionError(EmatixError):
    """The store's role lacks a privilege it needs (create schema/table, write)."""


class LeaseHeld(EmatixError):
    """Another run already holds this pipeline's lease (one writer per pipeline).

    A store sets ``pipeline`` and ``holder`` (the holder's text, as in the message).
    """

    pipeline: str | None = None
    holder: str | None = None


class LeaseLost(LeaseHeld):
    """Another run took this run's lease over (``acquire_lease(..., take_over=...)``) while it ran.

    The take-over raised the pipeline's lease epoch; the commit (or reset, or migration) that found
    the epoch moved on rolled back whole, its ``in_transaction`` writes with it. Terminal for this
    run: the taker is the pipeline's writer now, so this run must stop rather than retry. A
    ``LeaseHeld`` as well, so whoever treats a refused lease as "another run is at work" (Dagster's
    ``lease_held`` failures) treats this one alike. ``holder`` names the taker, ``epoch`` is the
    stored epoch, ``held_epoch`` this run's, ``batch`` the batch id that was not committed.
    """

    epoch: int | None = None
    held_epoch: int | None = None
    batch: int | None = None


class StateVersionError(EmatixError):
    """Stored state is newer than this code, or cannot be migrated."""


class CorruptState(EmatixError):
    """A stored blob or key does not decode."""


__all__ = ["RESTORE_OR_RESET", "ConfigError", "CorruptState", "EmatixError", "LeaseHeld", "LeaseLost", "StateVersionError", "StoreAccessDenied",
           "StoreConfigError", "StorePermissionError", "StoreUnavailable"]
