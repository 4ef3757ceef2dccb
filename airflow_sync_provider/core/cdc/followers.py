"""The pipelines that follow a copy, and a repair's wait for them.

A repair written into a copy a pipeline follows (a reconciliation's re-import of mismatched
shards: spark/full_load.py) ranks its rows by its reads' binlog positions, so every change
after a read out-ranks them and every change before it ranks below. That alone does not cover a
row the source deleted without a binlog event (``sql_log_bin=0``, a replica's own writes) after a
change of it the pipeline has yet to apply: the repair finds no such row to delete, and the
change, applied after the repair, brings it back. So the repair publishes once each running
pipeline following the copy has applied the binlog up to its newest read — the rolling
verification's rule (spark/cdc_verify.py: a look waits for the stream to reach its snapshot).
A pipeline that is not running is not waited for (it may stay stopped for days); the repair
names it, and a reconciliation once it has caught up finds such a row.
"""

from __future__ import annotations

import logging
import time

from airflow_sync_provider.core.cdc.checkpoints import PIPELINE_RUNNING, Checkpoints
from airflow_sync_provider.core.loads import LoadState
from airflow_sync_provider.core.positions import REPAIR_OFFSET, version_position

log = logging.getLogger(__name__)

WAIT_SECONDS = 300.0  # how long a repair waits for a running pipeline to apply the binlog up to its reads
POLL_SECONDS = 0.2


class FollowerBehind(RuntimeError):
    """A running pipeline did not reach a repair's reads in time: the repair is read, not published."""

    retry_helps = True


def following(checkpoints: Checkpoints, target_table: str) -> list[str]:
    """The pipelines with a table streaming (or joining) into ``target_table`` (``db.table``)."""
    if not checkpoints.exists("cdc_state"):
        return []
    wanted = tuple(target_table.split(".", 1))
    found = []
    for pipeline in checkpoints.pipelines():
        state = checkpoints.state(pipeline)
        tables = [*(state.tables if state else []), *(r.table for r in checkpoints.registrations(pipeline))]
        # its copy (also while a re-copy under a new layout fills another table beside it)
        if any(t.streaming and wanted in {(t.target_database, t.target_table), (t.target_database, t.writes_to)}
               for t in tables):
            found.append(pipeline)
    return found


def await_followers(ch, ledger_database: str, state: LoadState, wait_seconds: float | None = None) -> list[str]:
    """Wait until every running pipeline following ``state``'s copy has applied the binlog up to
    the newest read of its repair (``state.repair``'s shards, each read's version); returns a note
    for each pipeline not running and not there yet. Raises :class:`FollowerBehind` after
    ``wait_seconds`` (default WAIT_SECONDS)."""
    wait_seconds = WAIT_SECONDS if wait_seconds is None else wait_seconds
    versions = [state.shards[i].version for i in state.repair if i in state.shards]
    if not state.start_position or not versions:  # no binlog: no pipeline follows the copy
        return []
    read = version_position(max(versions) + REPAIR_OFFSET)  # (epoch, file number, offset) of the newest read
    where = f"binlog file {read[1]} offset {read[2]}" + (f" [epoch {read[0]}]" if read[0] else "")
    checkpoints, notes = Checkpoints(ch, ledger_database), []
    deadline = time.monotonic() + wait_seconds
    for pipeline in following(checkpoints, state.target_table):
        announced = False
        while True:
            now, at = checkpoints.state(pipeline), checkpoints.position(pipeline)
            if at is not None and at.key() >= read:
                break
            if now is None or now.status != PIPELINE_RUNNING or now.stale:
                notes.append(f"pipeline {pipeline!r} ({now.status if now else 'never run'}, at {at}) has not applied "
                             f"the binlog up to this repair's reads ({where}): the changes it applies next rank below "
                             "the repaired rows, but a row the source deleted without a binlog event after a change "
                             "it has yet to apply comes back with that change; reconcile again once it has caught up")
                log.warning("%s: %s", state.target_table, notes[-1])
                break
            if time.monotonic() > deadline:
                raise FollowerBehind(
                    f"load {state.load_key!r}: pipeline {pipeline!r} did not apply the binlog up to the repair's "
                    f"reads ({where}) within {wait_seconds:.0f} s (it is at {at}); the repair is read but not "
                    f"published: run it again once the pipeline has caught up (airflow-sync reconcile --load "
                    f"{state.load_key!r} --reimport finishes it first)")
            if not announced:
                log.info(f"{state.target_table}: the repair waits for pipeline {pipeline!r} (at {at}) to apply the "
                         f"binlog up to its reads ({where}) before it publishes")
                announced = True
            time.sleep(POLL_SECONDS)
    return notes
