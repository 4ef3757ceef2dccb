"""Crash points for recovery tests: with ``AIRFLOW_SYNC_CRASH_AT=<point>:<n>`` in the
environment, the process kills itself (SIGKILL: no cleanup, no finally) the n-th time it
passes ``<point>``. Without the variable a crash point is one dictionary lookup."""

from __future__ import annotations

import os
import signal

_passes: dict[str, int] = {}


def crash_point(name: str) -> None:
    wanted = os.environ.get("AIRFLOW_SYNC_CRASH_AT")
    if not wanted:
        return
    point, _, count = wanted.partition(":")
    if point == name:
        _passes[name] = _passes.get(name, 0) + 1
        if _passes[name] >= int(count or 1):
            os.kill(os.getpid(), signal.SIGKILL)
