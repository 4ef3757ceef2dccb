"""Where the package's log lines go when a job runs: its driver's output (the operator copies
that into the task log, the command line into its log file), one readable line each."""

from __future__ import annotations

import logging
import sys


class _Stdout(logging.StreamHandler):
    """A handler writing to whatever ``sys.stdout`` is when a record comes (a test's capture too)."""

    def __init__(self):
        super().__init__()

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


class _Lines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname} "
        return f"[airflow-sync] {level}{super().format(record)}"


def to_stdout(level: int = logging.INFO) -> None:
    """Send the package's records to standard output (idempotent)."""
    logger = logging.getLogger("airflow_sync_provider")
    if not any(isinstance(h, _Stdout) for h in logger.handlers):
        handler = _Stdout()
        handler.setFormatter(_Lines("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
