"""A CDC pipeline's state in the ledger: checkpoint, tables, heartbeat, errors, counters.

Tables join a pipeline through ``cdc_tables``: a bootstrap (or a full load given to
``start_from_loads``) registers its table with the binlog position its copy began at
(``since``); the applier replays that table alone from there up to the pipeline's checkpoint
(or from its own start for a new pipeline) and then marks it joined, so the others never wait
for it and it never misses a change (docs/cdc-bootstrap.md).

Like the load ledger (core/ledger.py) the tables live in the ClickHouse target and are
append-only: a checkpoint is one INSERT of one row (atomic; never delete-then-insert), written
only after every target write it covers has been acknowledged, and readers take the newest
row (``FINAL``). Counters (events read, rows written, rows failed) are kept per pipeline,
table and minute (patent S71/S72).

A pipeline's state rows (``cdc_state``) carry the **generation** of the applier's lease
(core/cdc/lease.py) and are kept per (pipeline, generation): readers take the highest
generation's newest row, so the writes of an applier that lost its lease are ignored as soon as
its successor has written once. While an applier holds the lease, every write through
:class:`Checkpoints` checks it first.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from airflow_sync_provider.core.cdc.tables import PipelineTable, Registration
from airflow_sync_provider.core.clickhouse.client import client
from airflow_sync_provider.core.clickhouse.described import table_facts
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE, LedgerTables
from airflow_sync_provider.core.ledger import TIME_TYPE as _TIME
from airflow_sync_provider.core.ledger import utc_datetime as _ts
from airflow_sync_provider.core.loads import STALE_AFTER_SECONDS
from airflow_sync_provider.core.positions import BinlogPosition
from airflow_sync_provider.core.series import SeriesWriter

# failed: a retry may help (it replays from the checkpoint); stopped: it cannot until the remedy
# in the error is applied (the checkpoint stays before the cause, so every retry stops there again)
PIPELINE_IDLE, PIPELINE_RUNNING, PIPELINE_FAILED, PIPELINE_STOPPED = "idle", "running", "failed", "stopped"


_UNREAD = object()  # an argument the caller did not give (None is a value)


class SelectionConflict(ValueError):
    """A run gave patterns other than its pipeline's, without saying to change them."""

    retry_helps = False


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class PipelineState:
    pipeline: str
    status: str = PIPELINE_IDLE
    checkpoint: BinlogPosition | None = None  # everything before it is durable in the target
    tables: list[PipelineTable] = field(default_factory=list)  # every table, those that left included
    error: str = ""
    source_position: BinlogPosition | None = None  # the source's position when last seen
    source_time: float = 0.0  # the source's timestamp of the last applied transaction
    events: int = 0  # row changes applied, in total
    heartbeat: float = 0.0
    generation: int = 0  # the lease's (core/cdc/lease.py) under which the row was written
    holder: str = ""  # the applier holding that lease: host, pid, source connection
    server: dict | None = None  # the server the checkpoint is a position on (core/cdc/servers.Server)
    # XA transactions prepared before the checkpoint and not committed by then: xid → where each
    # began (core/cdc/binlog/reader.BinlogReader reads their rows again from there) and, for one whose
    # rows wait in staging (core/cdc/staging.py), "staged": its rows per table
    prepared: dict = field(default_factory=dict)
    # a transaction being applied in pieces (core/cdc/binlog/batches.Batch), written past the checkpoint
    # but not claimed: where it began, how far it was read, since when, row changes written
    applying: dict | None = None
    # the acting foreign keys as of the checkpoint (core/cdc/foreign_keys.py; None: not read yet)
    foreign_keys: list | None = None

    @property
    def stale(self) -> bool:
        return self.status == PIPELINE_RUNNING and time.time() - self.heartbeat > STALE_AFTER_SECONDS

    @property
    def ended_badly(self) -> bool:
        return self.status in (PIPELINE_FAILED, PIPELINE_STOPPED)

    def table(self, name: str) -> PipelineTable | None:
        return next((t for t in self.tables if t.name == name), None)

    def verification(self) -> dict:
        """Verified / repaired counts over the pipeline's tables, each table's last pass and the
        one under way, and the table whose last pass is the oldest (never verified first)."""
        tables = [{"table": t.name, "verifications": t.verifications, "repaired_shards": t.repaired,
                   "due": t.verify_due, "last": t.verified,
                   "pass": {k: t.verify_pass[k] for k in ("started", "next", "slices")} if t.verify_pass else None}
                  for t in self.tables if t.streaming]
        by_age = sorted(tables, key=lambda t: (t["last"] or {}).get("at", 0.0))
        oldest = {"table": by_age[0]["table"], "verified_at": (by_age[0]["last"] or {}).get("at")} if by_age else None
        return {"verifications": sum(t["verifications"] for t in tables),
                "repaired_shards": sum(t["repaired_shards"] for t in tables),
                "unverified": [t["table"] for t in tables if not t["verifications"]],
                "due": [t["table"] for t in tables if t["due"]], "oldest": oldest, "tables": tables}

    def verification_line(self, now: float | None = None) -> str:
        v = self.verification()
        oldest = v["oldest"]
        if oldest is None:
            return "no table to verify"
        age = ("never verified" if not oldest["verified_at"]
               else f"verified {_age((now or time.time()) - oldest['verified_at'])} ago")
        head = (f"{v['verifications']} verification(s), {v['repaired_shards']} shard(s) repaired"
                if v["verifications"] else "not verified yet")
        return (head + (f", {len(v['unverified'])} table(s) never verified" if v["unverified"] and v["verifications"]
                        else "") + (f", {len(v['due'])} due" if v["due"] else "")
                + f"; oldest: {oldest['table']} {age}")


    def to_dict(self) -> dict:
        return {"pipeline": self.pipeline, "status": self.status, "stale": self.stale,
                "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
                "tables": [t.name for t in self.tables if t.streaming],
                # what schema changes did to tables (spark/cdc_ddl.py): left the pipeline, re-copied
                "schema_changes": [{"table": t.name, **{k: getattr(t, k) for k in ("left", "recopies", "last_recopy",
                                                                                    "recopying") if getattr(t, k)}}
                                   for t in self.tables if t.left or t.recopies or t.recopying],
                # the pipeline's checks of its copies (spark/cdc_verify.py)
                "verification": self.verification(), "error": self.error,
                "source_position": self.source_position.to_dict() if self.source_position else None,
                "source_time": self.source_time, "events": self.events, "heartbeat": self.heartbeat,
                "generation": self.generation, "holder": self.holder, "server": self.server,
                "epoch": self.checkpoint.epoch if self.checkpoint else 0, "prepared_xa": sorted(self.prepared),
                "staged_xa": {xid: e["staged"] for xid, e in self.prepared.items()
                              if isinstance(e, dict) and e.get("staged") is not None},
                "applying": self.applying}

    def applying_line(self, now: float | None = None) -> str:
        """What the applier is doing inside a large transaction ("" when nothing)."""
        a = self.applying
        if not a:
            return ""
        began = BinlogPosition.from_dict(a["began"])
        what = (f"{a['changes']:,} row changes written" + (f", {a['staged']:,} rows of an XA transaction staged"
                                                          if a.get("staged") else ""))
        running = self.status == PIPELINE_RUNNING
        return (f"a large transaction{' of ' + a['joining'] + ' (joining)' if a.get('joining') else ''} "
                f"{'is' if running else 'was'} being applied in pieces{'' if running else ' when the run ended'}: "
                f"{what} in {a['pieces']} piece(s), read up to {BinlogPosition.from_dict(a['through'])}; it began "
                f"at {began}, {_age((now or time.time()) - a['since'])} ago. The checkpoint stays before it until "
                "its commit is applied" + (" (a crash in between writes it again from its start)" if running
                                           else "; the next run applies it again from its start"))


_STATE = (
    ("pipeline", "String"), ("generation", "UInt64"), ("holder", "String"), ("status", "LowCardinality(String)"),
    ("checkpoint", "String"), ("tables", "String"), ("error", "String"), ("source_position", "String"),
    ("source_time", "Float64"), ("events", "UInt64"), ("updated_at", _TIME), ("server", "String"),
    ("prepared", "String"), ("applying", "String"), ("foreign_keys", "String"),
)
_COUNTERS = (
    ("pipeline", "String"), ("source_table", "String"), ("minute", "DateTime('UTC')"), ("events", "UInt64"),
    ("rows_written", "UInt64"), ("rows_failed", "UInt64"), ("at", _TIME),
)
_TABLES = (
    ("pipeline", "String"), ("source_table", "String"), ("config", "String"), ("since", "String"),
    ("joined", "UInt8"), ("updated_at", _TIME),
)
# the tables a pipeline selects by pattern (core/selection.py), kept by the bootstrap or
# the apply that first gave them: every later run applies them
_SELECTIONS = (("pipeline", "String"), ("selection", "String"), ("updated_at", _TIME))
# a source group's pipeline: its sources (each a pipeline <pipeline>@<source>) and its merged copy
_GROUPS = (("pipeline", "String"), ("sources", "Array(String)"), ("merge_into", "String"), ("updated_at", _TIME))


@dataclass(frozen=True)
class GroupRecord:
    """A source group's pipeline as the ledger keeps it (``cdc_groups``): its sources (each a
    pipeline ``<pipeline>@<source>``) and its merged copy (``""``: the sources side by side)."""

    sources: tuple[str, ...]
    merge_into: str = ""

    @classmethod
    def of(cls, value: dict) -> "GroupRecord":
        return cls(tuple(value["sources"]), value.get("merge_into", ""))

    def to_dict(self) -> dict:
        return {"sources": list(self.sources), "merge_into": self.merge_into}

    @property
    def merged(self) -> bool:
        return bool(self.merge_into)

# a request that the applier of one lease generation stop at its next batch boundary (``cdc stop``):
# by generation, so a request never stops a later run
_STOPS = (("pipeline", "String"), ("generation", "UInt64"), ("reason", "String"), ("updated_at", _TIME))


class Checkpoints(LedgerTables):
    lease = None  # the applier's Lease while it holds one: every write checks it first
    _series = None  # its SeriesWriter (core/series.py), made at the first state written

    def ensure(self) -> None:
        created = self._ensure_tables([
            ("cdc_state", _STATE, "ReplacingMergeTree(updated_at) ORDER BY (pipeline, generation)"),
            ("cdc_counters", _COUNTERS, "MergeTree ORDER BY (pipeline, source_table, minute)"),
            ("cdc_tables", _TABLES, "ReplacingMergeTree(updated_at) ORDER BY (pipeline, source_table)"),
            ("cdc_selections", _SELECTIONS, "ReplacingMergeTree(updated_at) ORDER BY pipeline"),
            ("cdc_groups", _GROUPS, "ReplacingMergeTree(updated_at) ORDER BY pipeline"),
            ("cdc_stops", _STOPS, "ReplacingMergeTree(updated_at) ORDER BY (pipeline, generation)"),
        ])
        # earlier releases kept one row per pipeline in cdc_pipelines (no generations): carry
        # their states over as generation 0 (two processes doing this at once insert equal rows)
        if "cdc_state" in created and int(self.ch.command(f"EXISTS TABLE {self.table('cdc_pipelines')}")):
            added = ("generation", "holder", "server", "prepared", "applying", "foreign_keys")  # since then
            names = ", ".join(n for n, _ in _STATE if n not in added)
            self.ch.command(f"INSERT INTO {self.table('cdc_state')} ({names}, generation, holder) "
                            f"SELECT {names}, 0, '' FROM {self.table('cdc_pipelines')} FINAL")

    def fence(self) -> None:
        if self.lease is not None:
            self.lease.check()

    def write(self, state: PipelineState) -> None:
        """Record the state; the checkpoint in it must already be durable in the target."""
        self.fence()
        state.heartbeat = self._stamp()
        self._insert("cdc_state", [[
            state.pipeline, state.generation, state.holder, state.status,
            json.dumps(state.checkpoint.to_dict()) if state.checkpoint else "",
            json.dumps([t.to_dict() for t in state.tables]),
            state.error[:4000], json.dumps(state.source_position.to_dict()) if state.source_position else "",
            state.source_time, state.events, _ts(state.heartbeat), json.dumps(state.server) if state.server else "",
            json.dumps(state.prepared) if state.prepared else "", json.dumps(state.applying) if state.applying else "",
            json.dumps(state.foreign_keys) if state.foreign_keys is not None else "",
        ]], _STATE)
        # the Sync view's lag and throughput over time: a point every 10 s at most, never failing the write
        self._series = self._series or SeriesWriter(self.ch, self.database)
        self._series.pipeline(state, state.heartbeat)

    def state(self, pipeline: str) -> PipelineState | None:
        """The newest row of the highest generation (an older generation's applier has lost its lease)."""
        rows = self.ch.query(
            f"SELECT status, checkpoint, tables, error, source_position, source_time, events, toFloat64(updated_at),"
            f" generation, holder, server, prepared, applying, foreign_keys FROM {self.table('cdc_state')} FINAL"
            f" WHERE pipeline = {{p:String}}"
            f" ORDER BY generation DESC LIMIT 1", parameters={"p": pipeline}).result_rows
        if not rows:
            return None
        (status, checkpoint, tables, error, source, source_time, events, heartbeat, generation, holder, server,
         prepared, applying, foreign_keys) = rows[0]
        return PipelineState(pipeline, status, BinlogPosition.from_dict(json.loads(checkpoint) if checkpoint else None),
                             [PipelineTable.from_dict(t) for t in json.loads(tables)], error,
                             BinlogPosition.from_dict(json.loads(source) if source else None), source_time, events,
                             heartbeat, generation, holder, json.loads(server) if server else None,
                             json.loads(prepared) if prepared else {}, json.loads(applying) if applying else None,
                             json.loads(foreign_keys) if foreign_keys else None)

    def pipelines(self) -> list[str]:
        """Every pipeline that has a state, by name."""
        return [p for (p,) in self.ch.query(f"SELECT DISTINCT pipeline FROM {self.table('cdc_state')}"
                                            " ORDER BY pipeline").result_rows]

    def generation(self, pipeline: str) -> int:
        """The highest lease generation the pipeline's state has seen (0: none)."""
        return int(self.ch.command(f"SELECT max(generation) FROM {self.table('cdc_state')}"
                                   f" WHERE pipeline = {{p:String}}", parameters={"p": pipeline}))

    def registrations(self, pipeline: str) -> list[Registration]:
        rows = self.ch.query(f"SELECT config, since, joined FROM {self.table('cdc_tables')} FINAL"
                             f" WHERE pipeline = {{p:String}} ORDER BY source_table",
                             parameters={"p": pipeline}).result_rows
        return [Registration(PipelineTable.from_dict(json.loads(config)),
                             BinlogPosition.from_dict(json.loads(since) if since else None), bool(joined))
                for config, since, joined in rows]

    def write_registration(self, pipeline: str, registration: Registration) -> None:
        self.fence()
        self._insert("cdc_tables", [[
            pipeline, registration.name, json.dumps(registration.table.to_dict()),
            json.dumps(registration.since.to_dict()) if registration.since else "", int(registration.joined),
            _ts(self._stamp())]], _TABLES)

    def register(self, pipeline: str, table: PipelineTable, since: BinlogPosition, again: bool = False) -> Registration:
        """Add a table whose copy began at ``since``. A table already streaming stays as it is,
        unless ``again`` (a bootstrap with restart=True: the copy began anew, so its changes are
        replayed from there and the pipeline takes the table's new entry)."""
        known = {r.name: r for r in self.registrations(pipeline)}
        registration = Registration(table, since)
        if table.name in known and known[table.name].joined and not again:
            return known[table.name]
        self.write_registration(pipeline, registration)
        return registration

    def forget_tables(self, pipeline: str) -> None:
        self.fence()
        self.ch.command(f"DELETE FROM {self.table('cdc_tables')} WHERE pipeline = {{p:String}}",
                        parameters={"p": pipeline})

    def selection(self, pipeline: str) -> dict | None:
        """The patterns the pipeline selects its tables by (None: tables named one by one)."""
        rows = self.ch.query(f"SELECT selection FROM {self.table('cdc_selections')} FINAL"
                             " WHERE pipeline = {p:String}",
                             parameters={"p": pipeline}).result_rows
        return json.loads(rows[0][0]) if rows and rows[0][0] else None

    def selection_for(self, pipeline: str, given: dict | None, change: bool = False, kept=_UNREAD) -> dict | None:
        """The patterns a run of ``pipeline`` applies: its own when the run gives none or the same
        ones; the run's when the pipeline has none yet or ``change`` says to replace them. Other
        patterns are refused (nothing is changed): a pipeline's selection changes only explicitly.
        ``kept``: the pipeline's own (a TableSelection), when the caller has read them."""
        from airflow_sync_provider.core.selection import TableSelection

        kept = TableSelection.of(self.selection(pipeline)) if kept is _UNREAD else kept
        asked = TableSelection.of(given)
        if asked is None or asked == kept:
            return kept.to_dict() if kept else None
        if kept is not None and not change:
            raise SelectionConflict(
                f"pipeline {pipeline!r} selects its tables by {kept.to_dict()}; this run asks for {asked.to_dict()}. "
                "Nothing was changed. Give the same patterns (or none: the pipeline keeps its own), or change them "
                "explicitly with change_selection=True (--change-selection)")
        return asked.to_dict()

    def write_selection(self, pipeline: str, selection: dict | None) -> None:
        self.fence()
        self._insert("cdc_selections", [[pipeline, json.dumps(selection) if selection else "", _ts(self._stamp())]],
                     _SELECTIONS)

    def write_group(self, pipeline: str, group: GroupRecord) -> None:
        """A source group's pipeline: its sources and merged copy (the status, sensor and Sync view
        show it as one copy with a row per source)."""
        self._insert("cdc_groups", [[pipeline, list(group.sources), group.merge_into, _ts(self._stamp())]], _GROUPS)

    def group(self, pipeline: str) -> GroupRecord | None:
        """The record of a source group's pipeline, or None (not a group's)."""
        rows = self.ch.query(f"SELECT sources, merge_into FROM {self.table('cdc_groups')} FINAL"
                             " WHERE pipeline = {p:String}", parameters={"p": pipeline}).result_rows
        return GroupRecord(tuple(rows[0][0]), rows[0][1]) if rows else None

    def request_stop(self, pipeline: str, reason: str = "") -> int | None:
        """Ask the pipeline's running applier to stop at its next batch boundary, as if its
        ``max_seconds`` had run out: checkpoint written, re-copies finished, state ``idle``.
        Returns the generation asked, or None when no applier is running."""
        state = self.state(pipeline)
        if state is None or state.status != PIPELINE_RUNNING:
            return None
        self._insert("cdc_stops", [[pipeline, state.generation, reason, _ts(self._stamp())]], _STOPS)
        return state.generation

    def stop_requested(self, pipeline: str, generation: int) -> str | None:
        """The reason a stop of this generation's applier was asked for (None: not asked)."""
        rows = self.ch.query(f"SELECT reason FROM {self.table('cdc_stops')} FINAL WHERE pipeline = {{p:String}}"
                             " AND generation = {g:UInt64}", parameters={"p": pipeline, "g": generation}).result_rows
        return rows[0][0] if rows else None

    def position(self, pipeline: str) -> BinlogPosition | None:
        """Up to where every table of the pipeline is durable: its checkpoint, or a table still
        replaying towards it (None before the first checkpoint)."""
        state = self.state(pipeline)
        if state is None or state.checkpoint is None:
            return None
        behind = [r.since for r in self.registrations(pipeline) if not r.joined and r.since is not None]
        return min([state.checkpoint, *behind], key=BinlogPosition.key)

    def count(self, pipeline: str, per_table: dict[str, tuple[int, int, int]]) -> None:
        """Add (events, rows written, rows failed) per source table to this minute's counters."""
        now = time.time()
        minute = _ts(now - now % 60)
        rows = [[pipeline, table, minute, *counts, _ts(now)] for table, counts in per_table.items() if any(counts)]
        if rows:
            self.fence()
            self._insert("cdc_counters", rows, _COUNTERS)

    def counters(self, pipeline: str, minutes: int = 10) -> list[dict]:
        """Per table and minute, the newest ``minutes`` minutes with activity."""
        result = self.ch.query(
            f"SELECT source_table, minute, sum(events), sum(rows_written), sum(rows_failed)"
            f" FROM {self.table('cdc_counters')} WHERE pipeline = {{p:String}}"
            f" AND minute >= (SELECT max(minute) FROM {self.table('cdc_counters')} WHERE pipeline = {{p:String}})"
            f" - INTERVAL {{m:UInt32}} MINUTE"
            f" GROUP BY source_table, minute ORDER BY minute, source_table", parameters={"p": pipeline, "m": minutes})
        return [{"table": t, "minute": m.isoformat() if hasattr(m, "isoformat") else str(m), "events": e,
                 "rows_written": w, "rows_failed": f} for t, m, e, w, f in result.result_rows]

    def copies(self, state: PipelineState) -> dict:
        """The pipeline's tables whose copy exists (in this ClickHouse), in its order, by name:
        the copy's ``TableFacts`` (core/clickhouse/described.py), its layout, source key and content
        as its table comment records them (``airflow-sync cdc status``, the Sync view's pipeline page)."""
        wanted = {t.name: (t.target_database, t.target_table) for t in state.tables}
        facts = table_facts(self.ch, list(wanted.values()))
        return {name: facts[pair] for name, pair in wanted.items() if pair in facts}


def check_position(target_endpoint, pipeline: str, position: "BinlogPosition | dict | str | None" = None,
                   max_lag_seconds: float | None = None, source_endpoint=None,
                   database: str = DEFAULT_LEDGER_DATABASE) -> tuple[str, str, dict]:
    """('success' | 'wait' | 'failed', message, summary) — the binlog position sensor's decision.

    Success when the pipeline's checkpoint has reached ``position`` (a position, or a GTID state;
    across a failover, core/cdc/servers.reached; a position naming no epoch is one on the server
    the pipeline reads now, core/cdc/servers.as_target), or (``max_lag_seconds``) when it is at the
    source's current position or its last applied change is at most that old. Failed when the
    pipeline reports an error (its last run failed or stopped).
    """
    from airflow_sync_provider.core.cdc.servers import Server, as_target, server_of, source_epoch
    from airflow_sync_provider.core.cdc.servers import reached as has_reached
    from airflow_sync_provider.core.positions import current_position
    from airflow_sync_provider.core.source import reader as mysql_reader
    ch = client(target_endpoint)
    try:
        ledger = Checkpoints(ch, database)
        ledger.ensure()
        state = ledger.state(pipeline)
        reached = ledger.position(pipeline)
    finally:
        ch.close()
    summary = {"pipeline": pipeline,
               "target_position": position.to_dict() if isinstance(position, BinlogPosition) else position}
    if state is None or reached is None:
        return "wait", f"pipeline {pipeline!r} has no checkpoint yet", summary
    position = as_target(position, epoch=reached.epoch)
    summary |= {"checkpoint": reached.to_dict(), "status": state.status, "events": state.events,
                "generation": state.generation, "holder": state.holder, "server": state.server,
                "epoch": reached.epoch,
                "verification": {k: v for k, v in state.verification().items() if k != "tables"}}
    if state.status == PIPELINE_STOPPED:
        return "failed", f"pipeline {pipeline!r} is stopped at checkpoint {state.checkpoint}: {state.error}", summary
    if state.status == PIPELINE_FAILED:
        return "failed", (f"pipeline {pipeline!r} failed at checkpoint {state.checkpoint}: {state.error} — fix the "
                          "cause and run it again (it replays from the checkpoint)"), summary
    if position is not None:
        if has_reached(reached, position):
            return "success", (f"pipeline {pipeline!r} reached {position} (checkpoint {reached}); "
                               f"{state.verification_line()}"), summary
        return "wait", f"pipeline {pipeline!r} at {reached}, waiting for {position}", summary
    ch = client(target_endpoint)
    try:
        with mysql_reader.connect(source_endpoint) as conn:
            here = server_of(conn)
            now = current_position(conn, epoch=source_epoch(conn, ch, database))
    finally:
        ch.close()
    if state.server and Server.from_dict(state.server).key != here.key:
        summary |= {"source_position": now.to_dict(), "lag_seconds": None}
        return "wait", (f"pipeline {pipeline!r}: the source is now {here}, its checkpoint {reached} is a position on "
                        f"{Server.from_dict(state.server)}; its next run resumes on the new server"), summary
    lag = 0.0 if has_reached(reached, now) else max(0.0, time.time() - state.source_time)
    summary |= {"source_position": now.to_dict(), "lag_seconds": round(lag, 3)}
    if lag <= (max_lag_seconds or 0.0):
        return "success", (f"pipeline {pipeline!r} lags {lag:.1f} s (bound {max_lag_seconds} s); "
                           f"{state.verification_line()}"), summary
    return "wait", f"pipeline {pipeline!r} lags {lag:.1f} s behind the source (bound {max_lag_seconds} s)", summary


def check_group_position(target_endpoint, pipeline: str, sources: dict, positions: dict | None = None,
                         max_lag_seconds: float | None = None, database: str = DEFAULT_LEDGER_DATABASE
                         ) -> tuple[str, str, dict]:
    """:func:`check_position` of a source group's pipeline (spark/cdc_group.py): every source's
    pipeline ``<pipeline>@<source>`` (``sources``: name → endpoint) at its own position
    (``positions``: name → position; a source without one: its lag bound), or within the lag
    bound. Failed as soon as one source's is (named); success once every source's is. The
    group's lag is its worst source's."""
    from airflow_sync_provider.core.source.group import part_pipeline

    verdicts = {name: check_position(target_endpoint, part_pipeline(pipeline, name), (positions or {}).get(name),
                                     max_lag_seconds, endpoint, database)
                for name, endpoint in sources.items()}
    lags = [s.get("lag_seconds") for _, _, s in verdicts.values()]
    summary = {"pipeline": pipeline, "sources": {name: s for name, (_, _, s) in verdicts.items()},
               "lag_seconds": None if any(lag is None for lag in lags) or not lags else max(lags)}
    failed = [m for v, m, _ in verdicts.values() if v == "failed"]
    if failed:
        return "failed", f"source group {pipeline!r}: " + "; ".join(failed), summary
    waiting = [m for v, m, _ in verdicts.values() if v == "wait"]
    if waiting:
        return "wait", (f"source group {pipeline!r}: {len(verdicts) - len(waiting)}/{len(verdicts)} sources there; "
                        + "; ".join(waiting)), summary
    return "success", f"source group {pipeline!r}: every source there (" + "; ".join(
        m for _, m, _ in verdicts.values()) + ")", summary
