"""A load's state as the ledger keeps it: its shards' attempts with their hook counters (patent
S51), and the verdict on them (the shard-counters sensor's, a reconciliation's input).

A shard's counters are counted by :class:`ShardState` alone, as its rows go: read (with their
bytes), written once the target acknowledged them, failed when their insert did; a bootstrap
chunk counts once it is durable. Storage is core/ledger.py's.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

STALE_AFTER_SECONDS = 120  # a running load whose driver has not reported for this long has died

# load status: running → published | failed ; shard status: running → success | failed (| mismatch)
LOAD_RUNNING, LOAD_PUBLISHED, LOAD_FAILED = "running", "published", "failed"
# an unfinished load left alone so long that its working tables were dropped: it starts afresh
LOAD_ABANDONED = "abandoned"
ABANDONED_AFTER_SECONDS = 7 * 86_400
SHARD_RUNNING, SHARD_SUCCESS, SHARD_FAILED, SHARD_MISMATCH = "running", "success", "failed", "mismatch"


def now() -> float:
    return time.time()



@dataclass
class ShardState:
    shard_id: int
    attempt: int
    status: str
    where: str
    params: list
    records_read: int = 0
    records_written: int = 0
    records_failed: int = 0
    bytes: int = 0
    started_at: float = 0.0
    finished_at: float | None = None
    error: str = ""
    version: int = 0  # the _version of this attempt's rows (its read's snapshot, core/positions.py)
    # bootstrap (chunked) shards: chunks finished and the last key they covered (JSON form,
    # core/cdc/chunks.py): a resumed shard continues after it
    chunks: int = 0
    resume_key: list | None = None
    executor: str = ""  # where the attempt ran: host name / address (executor_address)

    @property
    def seconds(self) -> float:
        return max(0.0, (self.finished_at or now()) - self.started_at) if self.started_at else 0.0

    # --- the hook counters (patent S51): counted here only, by whoever copies the shard ---------

    def count_read(self, rows: int, nbytes: int) -> None:
        """Rows read from the source (and their Arrow bytes), as they go to the target."""
        self.records_read += rows
        self.bytes += nbytes

    def count_written(self, rows: int) -> None:
        """Rows the target acknowledged."""
        self.records_written += rows

    def count_failed(self, rows: int) -> None:
        """Rows whose insert failed."""
        self.records_failed += rows

    def count_unacknowledged(self) -> None:
        """The insert carrying the rest of the shard's rows failed: every row read and not
        acknowledged failed with it."""
        self.records_failed = self.records_read - self.records_written

    def count_chunk(self, rows: int, written: int, nbytes: int) -> None:
        """A bootstrap chunk, counted once it is durable (a crash re-reads it, uncounted)."""
        self.records_read += rows
        self.records_written += written
        self.bytes += nbytes
        self.chunks += 1

    def counters_disagree(self) -> bool:
        """Do the counters say rows went missing: read != written, or any failed?"""
        return self.records_read != self.records_written or bool(self.records_failed)


@dataclass
class LoadState:
    load_key: str
    generation: int
    status: str
    source_table: str
    target_table: str
    plan: dict
    parts_table: str
    version: int  # the rows' version when the source has no binlog (else each shard's read sets it)
    spec: dict  # the job spec without secrets (for `airflow-sync reimport`)
    error: str = ""
    # the source's binlog position when the load began: catch-up can start there (a repair of
    # some of its shards keeps it: the others are as the load read them)
    start_position: dict | None = None
    # shards being re-imported into the published table (after a reconciliation found them
    # mismatched); empty for a load that publishes by swapping or replacing partitions
    repair: list[int] = field(default_factory=list)
    heartbeat: float = 0.0
    shards: dict[int, ShardState] = field(default_factory=dict)  # newest attempt per shard

    @property
    def stale(self) -> bool:
        return self.status == LOAD_RUNNING and now() - self.heartbeat > STALE_AFTER_SECONDS

    def todo(self) -> list[int]:
        """Shards still to read: every shard that has not succeeded (failed, mismatched, left
        ``running`` by a dead job, or never started)."""
        return [s["id"] for s in self.plan["shards"]
                if s["id"] not in self.shards or self.shards[s["id"]].status != SHARD_SUCCESS]

    def failed(self) -> list[int]:
        """Shards that ended badly: failed, mismatched, or left running by a job that is over."""
        bad = {SHARD_FAILED, SHARD_MISMATCH} | ({SHARD_RUNNING} if self.status != LOAD_RUNNING or self.stale else set())
        return sorted(i for i, s in self.shards.items() if s.status in bad)

    def to_dict(self) -> dict:
        return {
            "load_key": self.load_key, "generation": self.generation, "status": self.status,
            "stale": self.stale, "source_table": self.source_table, "target_table": self.target_table,
            "error": self.error, "shard_count": len(self.plan.get("shards", [])),
            "shards": [vars(s) | {"seconds": round(s.seconds, 3)}
                       for s in sorted(self.shards.values(), key=lambda s: s.shard_id)],
        }


def failing_shards(state: LoadState) -> list[int]:
    """The shards that make a load's counters verdict ``failed`` (none: it succeeded or is still
    under way): shards with bad counters (read != written, or failed rows), and once the load
    has ended (failed, published, abandoned, or its job died) every planned shard that did not
    succeed — a published load's shards a reconciliation marked: its copy is wrong there."""
    ids = [s["id"] for s in state.plan.get("shards", [])]
    bad_counters = [s.shard_id for s in state.shards.values() if s.status == SHARD_SUCCESS and s.counters_disagree()]
    ended = state.status in (LOAD_FAILED, LOAD_PUBLISHED, LOAD_ABANDONED) or state.stale
    undone = [i for i in ids if i not in state.shards or state.shards[i].status != SHARD_SUCCESS] if ended else []
    if not bad_counters and not undone:
        return []
    return sorted(set(state.failed()) | set(bad_counters) | set(undone))


def counters_verdict(state: LoadState | None) -> tuple[str, str]:
    """('success' | 'wait' | 'failed', message) — the shard-counters sensor's decision.

    Success: every planned shard succeeded with read == written and failed == 0.
    Failed (for good): the load failed or its job died (stale heartbeat), a shard finished with
    bad counters, or a reconciliation marked shards of the published copy as mismatched; the
    message names the shards and the re-import to run.
    """
    if state is None:
        return "wait", "no such load yet"
    ids = [s["id"] for s in state.plan.get("shards", [])]
    done = [i for i in ids if i in state.shards and state.shards[i].status == SHARD_SUCCESS]
    failed = failing_shards(state)
    if not failed and len(done) == len(ids) and ids:
        return "success", f"all {len(ids)} shards succeeded, read == written, failed == 0"
    if failed:
        errors = "; ".join(f"shard {i}: {state.shards[i].error[:200]}" for i in failed
                           if i in state.shards and state.shards[i].error)
        why = "died (no heartbeat)" if state.stale else state.status
        what = "differ from the source (reconciliation)" if state.status == LOAD_PUBLISHED else "did not complete"
        return "failed", (f"load {state.load_key!r} {why}: shards {failed} {what}"
                          + (f" ({errors})" if errors else "")
                          + f". Re-import them: airflow-sync reimport --load {state.load_key!r} --failed"
                          + " (or FullLoadOperator(..., reimport='failed'))")
    return "wait", f"{len(done)}/{len(ids)} shards done"



def executor_address(host: str, port: int) -> str:
    """This process's host name and the address it reaches ``host`` from: on a cluster, which
    executor (host, network) ran a shard."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))  # UDP: picks the route, sends nothing
            address = probe.getsockname()[0]
        except OSError:
            address = "?"
    return f"{socket.gethostname()}/{address}"


def set_verdict(load_key: str, states: dict, errors: dict) -> tuple[str, str, dict]:
    """The counters verdict of a job of many tables: failed if any table's is (``errors``: tables
    that failed before their load was recorded), success once all are."""
    verdicts = {key: ("failed", f"load {key!r} failed: {errors[key]}") if state is None and key in errors
                else counters_verdict(state) for key, state in states.items()}
    failed = {k: m for k, (v, m) in verdicts.items() if v == "failed"}
    waiting = [k for k, (v, _) in verdicts.items() if v == "wait"]
    verdict = "failed" if failed else "wait" if waiting or not states else "success"
    message = (f"{len(failed)} of {len(states)} table load(s) failed: " + "; ".join(failed.values()) if failed else
               f"{len(states) - len(waiting)}/{len(states)} table loads complete" if verdict == "wait" else
               f"all {len(states)} table loads: every shard succeeded, read == written, failed == 0")
    done = [s for s in states.values() if s is not None]
    return verdict, message, {
        "load_key": load_key, "verdict": verdict, "message": message, "tables": len(states),
        "rows_read": sum(x.records_read for s in done for x in s.shards.values()),
        "rows_written": sum(x.records_written for s in done for x in s.shards.values()),
        "failed_loads": sorted(failed)}


