"""A source group's full load (core/source/group.py): the selection applied to every source, and
with a ``merge`` every selected table copied into one merged copy, published at once.

Each source table is a load of its own — its ledger state, plan, shards and hook counters, under
``<group key>:<source>:<db>.<table>`` — so the counters sensor, reconciliation and re-import
work per source table and shard, and the group's key names them all (a load set, as a job of
many tables). What the members share:

* **one working table** in the merged layout, each member's rows carrying its source columns
  (a shared parts table numbers each member's shards from its own ``shard_base``);
* **one set of channels** (spark/shard_copy.run_together): the largest shards first, and in the
  driver any channel takes any member's next shard, so a slow server does not hold the others'
  channels idle;
* **one publish**: the whole merged copy swapped in, a period's partitions replaced across all
  sources, or the re-imported shards of a published copy repaired in place — then every member
  is marked published.

Without one each source's tables are copied side by side (spark/groups.py).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_sync_provider.core.clickhouse import repairs
from airflow_sync_provider.core.clickhouse.client import shared_client
from airflow_sync_provider.core.clickhouse.ddl import parts_table_name
from airflow_sync_provider.core.clickhouse.publishing import Loaded
from airflow_sync_provider.core.jobspec import FullLoadSpec, copied_schema, member_key
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.loads import LOAD_ABANDONED, LOAD_PUBLISHED
from airflow_sync_provider.core.selection import table_config
from airflow_sync_provider.core.source import reader as mysql_reader
from airflow_sync_provider.core.source.group import Member, member_view, merged_schema, one_server
from airflow_sync_provider.core.source.locks import LockHeld, load_lock
from airflow_sync_provider.core.source.planning import auto_split_factor
from airflow_sync_provider.core.source.schema import table_rows
from airflow_sync_provider.core.sql import ch_table
from airflow_sync_provider.spark.channels import driver_copy_limit
from airflow_sync_provider.spark.full_load import (
    LoadFailed,
    TableLoad,
    binlog_start,
    collect_left_behind,
    repaired_shards,
)
from airflow_sync_provider.spark.groups import CONNECT_AT_ONCE, group_members
from airflow_sync_provider.spark.session import lazy
from airflow_sync_provider.spark.shard_copy import run_together

log = logging.getLogger(__name__)

SHARDS_PER_MEMBER = 1 << 20  # a shared parts table: member i's shards are numbered from i << 20


def run_group_load(spec: FullLoadSpec, spark) -> dict:
    """``spec.sources`` with a ``merge``: the merged copy's load."""
    return GroupLoad(spec, lazy(spark)).run()


class GroupLoad:
    """A merged copy's load run: the members' :class:`TableLoad` steps with one working table,
    channels and publish."""

    def __init__(self, spec: FullLoadSpec, session):
        self.spec, self.session = spec, session
        self.started = time.time()
        self.ledger = Ledger(shared_client(spec.target), spec.ledger_database)
        self.ledger.ensure()
        self.locks = []

    def run(self) -> dict:
        spec, ledger = self.spec, self.ledger
        members = self._reimported() if spec.reimport else group_members(spec)
        merged = merged_schema([(m, schema) for m, _, _, schema in members], spec.merge.into)
        keys = [member_key(spec.load_key, m) for m, *_ in members]
        baseline, done = ledger.resume_point(spec.load_key, keys)
        if spec.reimport:
            done = set()
        ledger.write_load_set(spec.load_key, keys, baseline=baseline)  # the counters sensor waits on it
        log.info(f"group load {spec.load_key!r}: {len(members)} table(s) on {len(spec.sources)} source(s) into "
                 f"{spec.merge.into}" + (f"; {len(done)} published by its earlier run" if done else ""))
        if spec.skip_published and keys and set(keys) <= done | self._published_now(keys, baseline):
            log.info(f"group load {spec.load_key!r} is published; skipped")
            return self._summary([], members, skipped=True)
        self._lock()
        try:
            for source in spec.sources:
                collect_left_behind(dataclasses.replace(spec, sources=one_server(source.endpoint), merge=None),
                                    ledger)
            loads = self._prepare(members, merged, keys, done)
            per_shard = self._copy(loads)
            for load, records in zip(loads, per_shard):
                load.settle(records, self.in_driver)
            self._publish(loads, done)
            results = [load.done(records, grouped=True) | {"member": Member.of(load.spec.member).name}
                       for load, records in zip(loads, per_shard)]
            ledger.write_loads([load.state for load in loads])
            if loads:  # every member is recorded published: the working table goes
                working = loads[0].state.parts_table
                ledger.ch.command(f"DROP TABLE IF EXISTS {ch_table(spec.ledger_database, working)}")
        finally:
            for lock in self.locks:
                lock.release()
        return self._summary(results, members)

    def _reimported(self) -> list:
        """A re-import's members: those the group's load copied (its load set), as they copied them."""
        found = self.ledger.load_set(self.spec.load_key)
        if found is None:
            raise LoadFailed(f"group load {self.spec.load_key!r} is not in the ledger: nothing to re-import")
        sources = {s.name: s for s in self.spec.sources}
        members = []
        for key in found[0]:
            state = self.ledger.state(key)
            member = Member.of(state.spec["member"])
            source = sources.get(member.source)
            if source is None:
                raise LoadFailed(f"group load {self.spec.load_key!r} copied {member.name}, but no source named "
                                 f"{member.source!r} is given (sources: {sorted(sources)})")
            config = table_config({k: state.spec[k] for k in ("source_database", "source_table", "columns",
                                                               "exclude_columns", "split_column")})
            with mysql_reader.connect(source.endpoint) as conn:
                members.append((member, source, config, copied_schema(conn, state.spec)))
        return sorted(members, key=lambda m: m[0].name)

    def _published_now(self, keys: list[str], baseline: dict) -> set[str]:
        newest = self.ledger.newest_loads(keys)
        return {k for k in keys if newest.get(k, (0, ""))[1] == LOAD_PUBLISHED and newest[k][0] > baseline.get(k, 0)}

    def _lock(self) -> None:
        """The group's key on every source: one job runs it at a time."""
        for source in self.spec.sources:
            try:
                self.locks.append(load_lock(source.endpoint, self.spec.ledger_database, self.spec.load_key,
                                            f"group load {self.spec.load_key!r} (source {source.name})"))
            except LockHeld as held:
                for lock in self.locks:
                    lock.release()
                raise LoadFailed(str(held)) from None

    def _prepare(self, members, merged, keys: list[str], done: set[str]) -> list[TableLoad]:
        """Each member's load (resumed or new) on the group's working table, in one layout. Members
        are planned a few at a time; the binlog position is read once per source and the reader
        probed once per shape of table (core/source/reader.choose_reader), its choice kept for the
        members of that shape."""
        spec, ledger = self.spec, self.ledger
        states = ledger.states(keys)
        working = self._working(states, keys)
        todo = [(m, s, c, schema) for (m, s, c, schema), key in zip(members, keys) if key not in done]
        bases = self._shard_bases(todo, states)
        specs = []
        for member, source, config, schema in todo:
            one = spec.for_member(member, source.endpoint, config)
            state = states[one.load_key]
            if spec.reimport and (state is None or state.status == LOAD_PUBLISHED and not state.failed()):
                continue  # a re-import takes the members with failed or mismatched shards only
            specs.append((dataclasses.replace(one, member=one.member | {"shard_base": bases[member.name]}),
                          member_view(merged, member, schema), source))
        if not specs:
            if spec.reimport:
                raise LoadFailed(f"group load {spec.load_key!r}: no member has failed or mismatched shards to "
                                 "re-import")
            return []
        starts = self._starts({source.name: one for one, _, source in specs})
        specs = self._channels(specs)
        readers: dict = {}

        def prepare(item) -> TableLoad:
            one, view, source = item
            shape = _shape_key(view)
            if spec.reader == "auto" and shape in readers:
                one = dataclasses.replace(one, reader=readers[shape])
            load = TableLoad(one, self.session, ledger)
            load.prepare(view, working, starts[source.name], states)
            readers.setdefault(shape, "native" if load.copy.native_sql is not None else "mysqlclient")
            return load

        firsts = list({_shape_key(view): item for item in specs for view in [item[1]]}.values())
        with ThreadPoolExecutor(min(CONNECT_AT_ONCE, len(specs))) as pool:
            prepared = dict(zip(map(id, firsts), pool.map(prepare, firsts)))
            rest = [item for item in specs if id(item) not in prepared]
            prepared |= dict(zip(map(id, rest), pool.map(prepare, rest)))
        loads = [prepared[id(item)] for item in specs]
        direct = all(load.copy.direct for load in loads)
        for load in loads:
            load.use_layout(direct, load.spec.member["shard_base"] * SHARDS_PER_MEMBER)
        weighted = next((load for load in loads if load.copy.weight is not None), loads[0])
        weighted.create_working()  # one table; with the weight column if any member's rows carry one
        for load in loads:
            load.begin(grouped=True)
        ledger.write_loads([load.state for load in loads])
        total = sum(load.estimate() for load in loads)
        if total > driver_copy_limit(spec.driver_copy_rows, self.session):
            self.session.start()
        self.in_driver = loads[0].copy_in_driver(total)
        log.info(f"copying about {total:,} rows of {len(loads)} table(s) in {spec.speed().channel_count()} shared "
                 f"channel(s) " + ("in the driver" if self.in_driver else "as Spark tasks"))
        return loads

    def _channels(self, specs: list) -> list:
        """Each member planned with its share of the group's channels and of the shards one table
        of the group's rows would have (at least one each), by its estimated rows: shards of a
        group's many small tables stay about the size one table's would be (each shard costs a
        query and a ledger record), while the channels are shared."""
        def rows(item) -> int:
            with mysql_reader.connect(item[0].source) as conn:
                return table_rows(conn, item[0].source_database, item[0].source_table)

        with ThreadPoolExecutor(min(CONNECT_AT_ONCE, len(specs))) as pool:
            estimates = list(pool.map(rows, specs))
        channels, total = self.spec.speed().channel_count(), max(1, sum(estimates))
        shards = channels * (self.spec.split_factor or auto_split_factor(total, channels))
        out = []
        for (one, view, source), n in zip(specs, estimates):
            share = max(1, min(channels, round(channels * n / total)))
            factor = one.split_factor or max(1, round(shards * n / total / share))
            out.append((dataclasses.replace(one, channels=share, split_factor=factor, byte_speed=None,
                                            record_speed=None), view, source))
        return out

    def _starts(self, by_source: dict) -> dict:
        """Each source's binlog position (and version without one), read once for its members."""
        with ThreadPoolExecutor(min(CONNECT_AT_ONCE, len(by_source))) as pool:
            return dict(zip(by_source, pool.map(lambda one: binlog_start(one, self.ledger.ch), by_source.values())))

    def _working(self, states: dict, keys: list[str]) -> str:
        """The group's working table: the one its unfinished run was writing, else a new one (a
        re-import into the published copy: one for the repair)."""
        running = {s.parts_table for s in states.values() if s and s.status not in (LOAD_PUBLISHED, LOAD_ABANDONED)}
        if len(running) > 1:
            raise LoadFailed(f"group load {self.spec.load_key!r}: its members were started by different runs "
                             f"(working tables {sorted(running)}); run it under a new load key")
        if running:
            return running.pop()
        generation = max((s.generation for s in states.values() if s), default=0)
        if self.spec.reimport:
            return parts_table_name(f"{self.spec.load_key}:repair", generation)
        return parts_table_name(self.spec.load_key, generation + 1)

    @staticmethod
    def _shard_bases(todo, states: dict) -> dict[str, int]:
        """Each member's place in a shared parts table: kept from its stored spec, new ones after."""
        bases = {}
        for member, *_ in todo:
            stored = next((s.spec.get("member") for s in states.values()
                           if s and (s.spec.get("member") or {}).get("source") == member.source
                           and s.spec["member"].get("database") == member.database
                           and s.spec["member"].get("table") == member.table), None)
            if stored and "shard_base" in stored and stored["shard_base"] not in bases.values():
                bases[member.name] = stored["shard_base"]
        free = (i for i in range(len(todo) + len(bases) + 1) if i not in bases.values())
        for member, *_ in todo:
            bases.setdefault(member.name, next(free))
        return bases

    def lock_lost(self) -> str:
        """Why this job must stop writing: a source's lock on the group's key is gone."""
        lost = next((lock for lock in self.locks if lock.lost), None)
        return "" if lost is None else (
            f"group load {self.spec.load_key!r}: this job lost its lock {lost.name!r} on a source ({lost.lost}), so "
            "another run may own the load now; it writes nothing more. Run it again: it resumes from the finished "
            "shards")

    def _copy(self, loads: list[TableLoad]) -> list[list[dict]]:
        if not any(load.todo for load in loads):
            return [[] for _ in loads]
        for load in loads:
            load.copier.stopping = self.lock_lost
        return run_together([load.copier for load in loads], self.session, self.spec.speed().channel_count(),
                            self.in_driver)

    def _publish(self, loads: list[TableLoad], done: set[str]) -> int:
        """One publish for every member (:func:`full_load._publish`'s kinds): a repair of the
        members' re-read shards together, else the shared working table as a whole."""
        if not loads:
            return 0
        first = loads[0]
        if first.state.repair:
            shards = []
            for i, load in enumerate(loads):
                shards += [_prefixed(where, params, f"m{i}_", version)
                           for where, params, version in repaired_shards(load.spec, load.ch, load.schema, load.plan,
                                                                         load.state)]
            spec = first.spec
            loaded = Loaded(first.schema, spec.ledger_database, first.state.parts_table, spec.target_database,
                                   spec.target_table, any(load.copy.weight is not None for load in loads))
            return first.copier.outage.call(lambda: repairs.publish_repair(first.ch, loaded, shards),
                                            "publishing the repair")
        return first.publish(sum(load.written for load in loads) + self._done_rows(done))

    def _done_rows(self, done: set[str]) -> int:
        """Rows of members its earlier run published (a crash between publishing and recording)."""
        return sum(sum(s.records_written for s in state.shards.values())
                   for key in done if (state := self.ledger.state(key)) is not None)

    def _summary(self, results: list[dict], members, skipped: bool = False) -> dict:
        return {"load_key": self.spec.load_key, "merge_into": self.spec.merge.into, "tables": results,
                "sources": [s.name for s in self.spec.sources], "members": [m.name for m, *_ in members],
                "rows": sum(r["rows"] for r in results), "skipped": skipped, "failed": [],
                "seconds": round(time.time() - self.started, 3)}


def _prefixed(where: str, params: dict, prefix: str, version: int) -> tuple[str, dict, int]:
    """A shard predicate whose parameter names cannot meet another member's."""
    renamed = re.sub(r"\{(\w+):", lambda m: "{" + prefix + m.group(1) + ":", where)
    return renamed, {prefix + k: v for k, v in params.items()}, version


def _shape_key(view) -> tuple:
    """What decides how a member's rows read: its columns' definitions (not its source's tags)."""
    return tuple((c.name, c.column_type, c.charset, c.collation, c.absent) for c in view.columns if c.tag is None)
