"""What Spark's error for an input file means: the file, what is wrong with it, and the way out.

A file that does not fit the declared schema (a CSV header naming the columns in another order, a
parquet column of another type) becomes :class:`InputSchemaMismatch`; a file whose bytes cannot be
read (truncated, not in its format) :class:`UnreadableInputFile`. Both are terminal: retrying reads
the same file again. :func:`read_failure` finds the file in Spark's texts (for the batch step, which
may leave the file out, :mod:`.input_files`); :func:`classify_read_error` turns the error into the
run-stopping one (for :mod:`.failures`). Errors that may be about the machine rather than the file
(a missing file, a timeout, permissions) are left alone: a retry may read the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ematix_dagster.errors import EmatixError, InputSchemaMismatch, UnreadableInputFile

# Spark's texts (CSVHeaderChecker, error class FAILED_READ_FILE); the file is a URL.
_CSV_HEADER_NAMES = re.compile(r"CSV header does not conform to the schema\.\s*Header: (?P<header>[^\n]*)\n"
                               r"\s*Schema: (?P<schema>[^\n]*)\n(?:Expected: (?P<expected>[^\n]*) but found: "
                               r"(?P<found>[^\n]*)\n)?.*?CSV file: (?P<file>\S+)", re.DOTALL)
_CSV_HEADER_LENGTH = re.compile(r"Number of column in CSV header is not equal to number of fields in the schema:"
                                r"\s*Header length: (?P<header>\d+), schema size: (?P<schema>\d+)\s*"
                                r"CSV file: (?P<file>\S+)")
_PARQUET_TYPE = re.compile(r"PARQUET_COLUMN_DATA_TYPE_MISMATCH\] Encountered error while reading file (?P<file>\S+?)\. "
                           r"Data type mismatches when reading Parquet column (?P<column>.+?)\. Expected Spark type "
                           r"(?P<expected>.+?), actual Parquet type (?P<actual>[^.\s]+)")


def _texts(exc: BaseException) -> list[str]:
    """The texts of ``exc`` and of every exception it was raised from or while handling."""
    texts: list[str] = []
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        try:
            texts.append(str(e))
        except Exception:  # noqa: BLE001 - a Py4JJavaError asks the JVM for its text, and the JVM may be gone
            pass
        pending += [e.__cause__, e.__context__, getattr(e, "_cause", None)]  # _cause: PySpark's captured cause
    return texts


def url_path(url: str) -> str:
    """A file URL as a local path (decoded); any other URL as it is."""
    parts = urlsplit(url)
    return unquote(parts.path) if parts.scheme == "file" else url


def _csv_header(path: str) -> str:
    """The first line of a local CSV file, for a message (Spark names only the header's length)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return "(unreadable)"


_WAY_OUT_CSV = ("fix the file's header (or the declared schema) so that both list the same columns in the same "
                "order, or set header = false on the source to read every line by position (a header line is then "
                "read as a row of data)")
_WAY_OUT_SKIP = 'or set on_unreadable_file = "skip" on its source to leave such files out (counted and dead-lettered)'
REPLACE_FILE = "replace the file with a readable one under the same name (the failed batch reads it again)"

# FAILED_READ_FILE with a cause that says something about the file's bytes (not a missing file: the
# source's log still names it, and nothing about the bytes is known).
_FAILED_READ = re.compile(r"\[FAILED_READ_FILE\.(?P<kind>[A-Z_]+)\] Encountered error while reading file "
                          r"(?P<file>\S+?)\.(?=\s|$)")
_CAUSED_BY = re.compile(r"Caused by: (?P<cls>[\w.$]+)(?::[ \t]*(?P<msg>[^\n]*))?")
#: Causes about the machine or the network, not the file: a retry may read the file.
_NOT_THE_FILE = ("FileNotFoundException", "AccessDeniedException", "Permission denied", "SocketTimeoutException",
                 "ConnectException", "Connection reset", "UnknownHostException", "Filesystem closed",
                 "InterruptedException", "ClosedByInterruptException", "OutOfMemoryError", "TaskKilled",
                 "Too many open files")


@dataclass(frozen=True)
class ReadFailure:
    """Spark refusing one input file, as its error tells it."""

    url: str  # the file, as Spark names it
    problem: str  # what is wrong with the file, for a dead letter
    message: str  # the same for an operator, naming the file
    fix: str  # how to fix the file (or the schema)
    mismatch: bool  # the file does not fit the declared schema (InputSchemaMismatch), else unreadable

    def error(self, prefix: str = "", alternatives: str = _WAY_OUT_SKIP) -> EmatixError:
        cls = InputSchemaMismatch if self.mismatch else UnreadableInputFile
        return cls(f"{prefix}{self.message}", way_out=f"Way out: {self.fix}, {alternatives}")


def read_failure(exc: BaseException) -> ReadFailure | None:
    """The input file ``exc`` (or its cause) says Spark cannot read, and why; None when it names no
    file, or when the cause may be the machine rather than the file (a retry may then help)."""
    texts = _texts(exc)
    for text in texts:
        m = _CSV_HEADER_NAMES.search(text)
        if m:
            first = ""
            if m["expected"] is not None:  # they may differ in whitespace only: show them quoted
                first = f" (first difference: the schema's {m['expected']!r}, the header's {m['found']!r})"
            problem = (f"the header has the columns ({m['header']}), the schema ({m['schema'].strip()}){first}")
            return ReadFailure(m["file"], problem,
                               f"the header of CSV file {url_path(m['file'])} does not match the source's schema: "
                               f"{problem}; read by position, the values would land in the wrong columns",
                               _WAY_OUT_CSV, mismatch=True)
        m = _CSV_HEADER_LENGTH.search(text)
        if m:
            path = url_path(m["file"])
            problem = f"the header has {m['header']} columns ({_csv_header(path)}), the schema {m['schema']}"
            return ReadFailure(m["file"], problem, f"the header of CSV file {path} has {m['header']} columns "
                               f"({_csv_header(path)}), the source's schema {m['schema']}",
                               _WAY_OUT_CSV, mismatch=True)
        m = _PARQUET_TYPE.search(text)
        if m:
            return type_mismatch(m["file"], m["column"], m["actual"], m["expected"])
    for text in texts:
        m = _FAILED_READ.search(text)
        if m is None or m["kind"] == "FILE_NOT_EXIST":
            continue
        causes = [(c["cls"], c["msg"] or "") for c in _CAUSED_BY.finditer(text)
                  if not c["cls"].startswith(("org.apache.spark.", "py4j."))]
        if not causes or any(marker in f"{cls}: {msg}" for cls, msg in causes for marker in _NOT_THE_FILE):
            continue
        cls, msg = causes[0]  # the outermost cause past Spark's own: the reader's words
        problem = f"{cls.rsplit('.', 1)[-1]}: {msg}".rstrip(": ")
        return ReadFailure(m["file"], problem, f"Spark cannot read input file {url_path(m['file'])}: {problem}",
                           REPLACE_FILE, mismatch=False)
    return None


def type_mismatch(url: str, column: str, actual: str, expected: str) -> ReadFailure:
    """A parquet file holding ``column`` as a type Spark does not read as the declared one."""
    return ReadFailure(url, f"column {column} is {actual} in the file, {expected} in the source's schema",
                       f"Parquet file {url_path(url)} holds column {column} as {actual}, but the source's schema "
                       f"declares it {expected}",
                       "rewrite the file with the declared type (or declare the column's type as the files hold it)",
                       mismatch=True)


def classify_read_error(exc: BaseException) -> EmatixError | None:
    """:class:`InputSchemaMismatch` when ``exc`` (or its cause) is Spark refusing an input file that
    does not fit the declared schema, :class:`UnreadableInputFile` when the file's bytes cannot be
    read (truncated, not in its format); None for anything else. Retrying cannot help such a batch:
    the same file is read again. An error that is one of these already is returned as it is."""
    if isinstance(exc, (InputSchemaMismatch, UnreadableInputFile)):
        return exc
    failure = read_failure(exc)
    return None if failure is None else failure.error()
