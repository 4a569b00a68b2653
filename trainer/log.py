"""Diagnostics through :mod:`logging`, one logger per module under ``splat_train`` (errors of a
rank, launcher notes and warnings), written to the process's stderr as the bare message: the
lines read exactly as they did when they were printed (users and tests grep them). What a run
reports on purpose (progress bar, metrics lines, the final summary) stays on stdout through
report.Reporter.

Each spawned rank is its own process with its own handler; :func:`set_rank` records the rank on
every record (``%(rank)s``) for a user who adds a handler of their own with a richer format.
"""

from __future__ import annotations

import logging
import sys

ROOT = "splat_train"
_rank = 0


class _CurrentStderr(logging.StreamHandler):
    """A StreamHandler on whatever sys.stderr is when a record is emitted (a test's capture, a
    redirect made after import), not the stream of the moment it was created."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):  # noqa: D401
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it
        pass


def _add_rank(record: logging.LogRecord) -> bool:
    record.rank = _rank
    return True


def get_logger(name: str) -> logging.Logger:
    """The logger of module ``name`` (``__name__``), under the package's root logger, which writes
    bare messages to stderr (INFO and above) unless the application configured it already."""
    root = logging.getLogger(ROOT)
    if not root.handlers:  # an application that configured it keeps its own
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_add_rank)
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
    return logging.getLogger(name if name.startswith(ROOT) else f"{ROOT}.{name}")


def set_rank(rank: int) -> None:
    """This process's rank, recorded on every record from now on (``record.rank``)."""
    global _rank
    _rank = int(rank)
