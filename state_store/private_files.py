"""Files the SQLite store creates are private to their owner: mode 0600, whatever the umask.

Pending rows (schema step 7, docs/contract/row-pipelines.md) hold output rows that are not public yet, so the database
file must not be readable by other users; the rest of the state (windows, offsets) is no more
public than the target. Decisions:

* The store creates the database file itself, empty and 0600 (an empty file is an empty SQLite
  database), before SQLite opens it. SQLite creates the ``-wal`` and ``-shm`` files (and a
  rollback journal) with the database file's permissions, so they are 0600 too; the lock files
  (``<path>.<pipeline>.lock``) are created 0600 as well.
* An existing file keeps its mode: never changed silently, nor loudly. An operator may have shared
  it on purpose (a group that reads ``state``, a backup user), and a store that chmods files it did
  not create surprises whoever set them. Opening a database file that group or others can read
  logs a warning naming the file, the mode and the fix (``chmod 600``) instead.
* Directories are created with the umask as before: the files are what holds the rows.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE = 0o600


def create_private(path: Path) -> bool:
    """Create ``path`` empty with mode 0600 unless it exists; True when this call created it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, PRIVATE)  # exactly 0600: the umask can only have taken bits away
    finally:
        os.close(fd)
    return True


def warn_if_shared(path: Path, store: str) -> None:
    """Log a warning when the existing file ``path`` is readable or writable by group or others."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return
    if mode & 0o077:
        log.warning("%s: the database file's mode is %04o, so other users can read its state, including rows "
                    "still pending release (WATERMARK_TS()); the store leaves an existing file's mode as it is: "
                    "run `chmod 600 %s` (and its -wal and -shm files) unless they are shared on purpose",
                    store, mode, path)


__all__ = ["PRIVATE", "create_private", "warn_if_shared"]
