"""Crash and hold points for tests.

* Crash: with ``AIRFLOW_SYNC_CRASH_AT=<point>:<n>`` in the environment, the process kills itself
  (SIGKILL: no cleanup, no finally) the n-th time it passes ``<point>``.
* Hold: with ``AIRFLOW_SYNC_HOLD_DIR=<dir>``, a job passing ``<point>`` for a key waits while the
  file ``<dir>/<point>.<key>.hold`` exists, after creating ``<point>.<key>.arrived`` beside it. A
  test that creates the hold files of several keys and sees all of them arrive knows those jobs
  were under way at the same time — their own record, no clock compared — and lets them go by
  removing the holds (tests/test_airflow_real.py: a backfill's days loaded side by side).

Without the variables a point is one dictionary lookup."""

from __future__ import annotations

import os
import re
import signal
import time

_passes: dict[str, int] = {}
HOLD_AT_MOST_SECONDS = 900  # a test that died without releasing: the job goes on after this


def crash_point(name: str) -> None:
    wanted = os.environ.get("AIRFLOW_SYNC_CRASH_AT")
    if not wanted:
        return
    point, _, count = wanted.partition(":")
    if point == name:
        _passes[name] = _passes.get(name, 0) + 1
        if _passes[name] >= int(count or 1):
            os.kill(os.getpid(), signal.SIGKILL)


def hold_file(folder: str, name: str, key: str) -> str:
    """The hold file of ``name`` for ``key`` (``.arrived`` replaces ``.hold`` for the arrival)."""
    return os.path.join(folder, re.sub(r"[^A-Za-z0-9._-]", "_", f"{name}.{key}") + ".hold")


def arrived_file(hold: str) -> str:
    """The file a job makes beside ``hold`` once it waits there (its process id inside)."""
    return hold[:-len(".hold")] + ".arrived"


def hold_point(name: str, key: str) -> None:
    folder = os.environ.get("AIRFLOW_SYNC_HOLD_DIR")
    if not folder:
        return
    hold = hold_file(folder, name, key)
    if not os.path.exists(hold):
        return
    with open(arrived_file(hold), "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + HOLD_AT_MOST_SECONDS
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.2)
