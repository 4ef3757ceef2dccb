"""The job spec: one typed object the operator writes and the Spark job reads.

It carries passwords, so it travels as a 0600 file (never on argv); ``public_dict`` is the
form that may be logged or pushed to XCom.
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass, field
from typing import ClassVar

from airflow_sync_provider.core.clickhouse.inserts import MAX_BYTES as INSERT_BYTES
from airflow_sync_provider.core.clickhouse.inserts import MAX_ROWS as INSERT_ROWS
from airflow_sync_provider.core.clickhouse.layout import Layout, reshape_refused
from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content.shaping import Content
from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.failures import WAIT_SECONDS
from airflow_sync_provider.core.ledger import DEFAULT_LEDGER_DATABASE
from airflow_sync_provider.core.loads import ABANDONED_AFTER_SECONDS
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import (
    GroupPart,
    Member,
    Merge,
    Source,
    check_sources,
    is_group,
    one_server,
    only_endpoint,
    part_pipeline,
    refresh_view,
    tags_view,
)
from airflow_sync_provider.core.source.planning import STRATEGIES, Filter, SpeedLimits
from airflow_sync_provider.core.source.schema import TableSchema, read_table_schema
from airflow_sync_provider.core.typemap import MySQLColumn

READERS = ("auto", "native", "mysqlclient")
SIDE_BY_SIDE = "{source}_{database}"  # a group's target database per source, when not merged


@dataclass(kw_only=True)
class JobSpec:
    """What every job's spec carries: the ClickHouse ``target``; the MySQL ``sources`` (one server
    is a group of one: core/source/group.py); a source group's merged copy (``merge``); the tables
    it works on when they are many (``tableset``: named, by pattern, how many at once); the ledger's
    database; the one bounded wait a job spends on an unreachable server before it fails
    (core/failures.py); where a client-mode driver writes its result."""

    target: ClickHouseEndpoint
    sources: list = field(default_factory=list)
    merge: Merge | None = None
    tableset: TableSet = field(default_factory=TableSet)
    ledger_database: str = DEFAULT_LEDGER_DATABASE
    failure_wait_seconds: float = WAIT_SECONDS
    result_path: str = ""
    # the salt of the tables' hash transforms (core/content/transforms.py): a secret, travelling as
    # the passwords do (masked in the public form; a cluster-mode driver reads it from its environment)
    hash_salt: str = field(default="", repr=False)

    @property
    def salt(self) -> bytes:
        return self.hash_salt.encode()

    @property
    def source(self) -> MySQLEndpoint | None:
        """The job's one server (a group's spec has none: each of its parts has one)."""
        return only_endpoint(self.sources)

    @property
    def grouped(self) -> bool:
        """Is this a source group's spec (its parts run per source or per member)?"""
        return is_group(self.sources, self.merge)

    # a group not merged puts the tables that name no target database here (jobs that copy or
    # compare each source's tables side by side)
    side_by_side: ClassVar[str] = ""

    def __post_init__(self):
        """The sources, the merge and the tables in their types, checked (a spec file gives them as
        dicts); every spec's own checks come after."""
        self.sources = [Source.of(s) for s in self.sources]
        check_sources(self.sources)
        self.merge = Merge.of(self.merge)
        template = self.side_by_side if self.grouped and not self.merge else ""
        self.tableset = TableSet.of(self.tableset).configured(template)
        if self.merge and self.tableset.has_content:
            raise ContentError(f"the merged copy {self.merge.into}: transforms, a row filter, kept deletes or a "
                               "history are not supported for merged copies yet; shape each source's copy side by "
                               "side instead")
        if self.merge:  # one layout for the one table (its key: the primary key and the source columns)
            self.tableset.merged_layout(self.merge.into)


@dataclass(kw_only=True)
class FullLoadSpec(JobSpec):
    """Copy one MySQL table (or one period of it) into a ClickHouse table, published atomically.

    ``load_key`` names the load in the ledger: running the same key again resumes it (only
    unfinished shards are read); once published, the same key starts a fresh copy.

    Many tables in one job: a ``tableset`` (patterns and/or named tables, core/selection.py)
    instead of the four names; each table is a load of its own (:meth:`for_table`, key
    :func:`table_key`), ``tableset.parallel`` at a time (spark/tables.py).

    A source group: several ``sources`` (servers, each named), the selection applied to each;
    with ``merge`` every selected table goes into one merged copy, published at once
    (spark/group_load.py; each source table is a load of its own, :meth:`for_member`), else each
    source's tables are copied side by side (:meth:`for_source`).
    """

    source_database: str
    source_table: str
    target_database: str
    target_table: str
    load_key: str = ""
    reimport: str | None = None  # "failed": only an unpublished load's failed/unfinished shards
    channels: int | None = 2
    batch_rows: int = 65536  # rows per read batch, the unit a channel streams to ClickHouse
    # one INSERT per this many rows / Arrow bytes at most (core/clickhouse/inserts.py: few large
    # inserts are few parts for ClickHouse to merge; streamed, they cost the channel no memory)
    insert_rows: int = INSERT_ROWS
    insert_bytes: int = INSERT_BYTES
    # how shards are read (core/source/reader.py): "auto" (Arrow-native unless a probe of the
    # table's first rows disagrees with mysqlclient), "native", or "mysqlclient"
    reader: str = "auto"
    # a load estimated at no more rows than this is copied by the driver (its channels as
    # threads): starting executors (the SparkContext, Python workers) costs more than it saves.
    # None: 300,000 on a cluster, every table on a local master (its executors would be
    # processes of the same machine: the cost without the spread); 0: always executors
    driver_copy_rows: int | None = None
    # the columns copied: all (None) or these, minus exclude_columns (key columns always stay)
    columns: list | None = None
    exclude_columns: list = field(default_factory=list)
    split_column: str | None = None
    split_factor: int | None = None  # shards per channel; None: planning.auto_split_factor
    strategy: str = "balanced"
    # DataX flow control: global and per-channel bytes/s and records/s (None = unlimited)
    byte_speed: int | None = None
    record_speed: int | None = None
    channel_byte_speed: int | None = None
    channel_record_speed: int | None = None
    # period-scoped load: a MySQL filter (``%s`` placeholders + params) and the target
    # partitions (PARTITION BY ``partition_by``) it replaces
    where: str | None = None
    where_params: list = field(default_factory=list)
    partition_by: str | None = None
    replace_partitions: list = field(default_factory=list)
    skip_published: bool = False  # the key's load is published: return its summary, copy nothing
    reshape: bool = False  # the copy may be laid out otherwise: this load replaces it under its layout
    # other loads' working tables left this long without a report are dropped (their loads abandoned)
    abandon_after_seconds: float = ABANDONED_AFTER_SECONDS
    member: dict | None = None  # a load of one table of a merged copy (set by the group's run)
    job: str = field(default="full_load", init=False)
    side_by_side: ClassVar[str] = SIDE_BY_SIDE

    def __post_init__(self):
        super().__post_init__()
        if _group(self):
            self.speed().channel_count()
            if not self.load_key:
                self.load_key = f"group->{self.merge.into}" if self.merge else ""
            return
        if not self.sources:
            raise ValueError(f"table {self.source_table}: a full load reads a MySQL source (sources=[…])")
        if self.tableset:
            return
        self.speed().channel_count()  # a bad speed/channel configuration fails before submitting
        for name in ("batch_rows", "insert_rows", "insert_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)} (table {self.source_table})")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.reimport not in (None, "failed"):
            raise ValueError(f"reimport must be None or 'failed', got {self.reimport!r}")
        if self.reader not in READERS:
            raise ValueError(f"reader must be one of {READERS}, got {self.reader!r} (table {self.source_table})")
        _check_reader(self.reader, self.source, self.source_table)
        if bool(self.partition_by) != bool(self.replace_partitions) or (self.partition_by and not self.where):
            raise ValueError(f"table {self.source_table}: a period load needs where, partition_by and "
                             "replace_partitions together (e.g. where='created_at >= %s AND created_at < %s', "
                             "partition_by='toYYYYMMDD(created_at)', replace_partitions=['20250101'])")
        self.filter()  # placeholder/parameter count
        if not self.load_key:
            self.load_key = f"{self.source_database}.{self.source_table}->{self.target_database}.{self.target_table}"

    def filter(self) -> Filter:
        return Filter(self.where, tuple(self.where_params)) if self.where else Filter()

    @property
    def layout(self) -> Layout:
        """The copy's layout (one table's load: the job's, core/clickhouse/layout.py)."""
        return self.tableset.layout_of()

    @property
    def content(self) -> Content:
        """What the copy holds (one table's load: the job's, core/content/shaping.py)."""
        return self.tableset.content_of()

    def for_table(self, table: dict) -> "FullLoadSpec":
        """One selected table's load (``table``: a table_config)."""
        return dataclasses.replace(
            self, tableset=self.tableset.one(table),
            source_database=table["source_database"],
            source_table=table["source_table"], target_database=table["target_database"],
            target_table=table["target_table"], load_key=table_key(self.load_key, table),
            columns=table["columns"] or self.columns, exclude_columns=table["exclude_columns"] or self.exclude_columns,
            split_column=table["split_column"] or self.split_column)

    def speed(self) -> SpeedLimits:
        return SpeedLimits(channels=self.channels, byte=self.byte_speed, record=self.record_speed,
                           channel_byte=self.channel_byte_speed, channel_record=self.channel_record_speed)

    def for_member(self, member: Member, endpoint: MySQLEndpoint, table: dict) -> "FullLoadSpec":
        """One source table's load of a merged copy (``table``: its table_config)."""
        return dataclasses.replace(
            self, sources=one_server(endpoint), merge=None, tableset=self.tableset.merged_member(),
            member=dataclasses.asdict(member),
            source_database=member.database, source_table=member.table, target_database=self.merge.database,
            target_table=self.merge.table,
            load_key=member_key(self.load_key, member), columns=table["columns"] or self.columns,
            exclude_columns=table["exclude_columns"] or self.exclude_columns,
            split_column=table["split_column"] or self.split_column)


@dataclass(kw_only=True)
class ReconcileSpec(JobSpec):
    """Compare a published load's shards: source vs target counts (and checksums) vs hook counters.
    With ``reimport``, mismatched shards are re-imported into the published table and compared again."""

    load_key: str  # with a tableset: the prefix their loads were named with (:func:`table_key`)
    checksum: bool = False
    reimport: bool = False
    job: str = field(default="reconcile", init=False)

    def __post_init__(self):
        super().__post_init__()
        if self.grouped:
            if not self.load_key:
                raise ValueError("a source group's reconciliation needs the group load's key (load_key=...)")
            return
        if not self.tableset and not self.load_key:
            raise ValueError("a reconciliation needs the load's key (load_key=...), or tables by select=/tables=")

    def for_table(self, table: dict) -> "ReconcileSpec":
        return dataclasses.replace(self, tableset=TableSet(), load_key=table_key(self.load_key, table))


@dataclass(kw_only=True)
class CdcApplySpec(JobSpec):
    """Apply a pipeline's binlog changes to its ClickHouse copies, from its checkpoint.

    Tables join a pipeline from where their copies began: by a bootstrap (``CdcBootstrapSpec``,
    which registers them), from full loads (``start_from_loads``) or from ``start_position`` with
    ``tables``; a new pipeline starts at the earliest of those positions, a running one replays a
    new table up to its checkpoint before streaming it with the others. A bounded run
    (the default, an Airflow task) stops at ``stop_position``, by default the source's position
    when it starts; ``service`` runs until stopped (or ``max_seconds``).
    """

    pipeline: str
    # tableset: its named tables, and those its patterns select now and later created or renamed
    # onto a selected name, which join by a bootstrap beside the stream; those CDC cannot stream are named
    start_from_loads: list = field(default_factory=list)
    start_position: dict | None = None
    stop_position: dict | None = None
    service: bool = False
    max_seconds: float | None = None
    lanes: int = 4  # apply lanes = concurrent writers to ClickHouse (Spark tasks or driver threads)
    vnodes: int = 256  # virtual nodes per lane on the hash ring
    batch_events: int = 50_000  # a bounded run: fewer, larger batches cost fewer checkpoints and writes
    # The memory bound, whatever a transaction's size: a batch holds at most about batch_events row
    # changes and batch_bytes of their row events, and a transaction that outgrows either is
    # written in pieces of that size as it is read (the checkpoint still moves only past commits;
    # a parked XA transaction beyond it waits in staging tables). With the defaults the applier's
    # processes stay under 1 GiB at any transaction size (docs/cdc.md, Large transactions)
    batch_bytes: int = 16 << 20
    batch_seconds: float = 1.0
    # a batch of at most this many row changes is written by lane threads in the driver: a Spark
    # job per batch costs more than it saves (and the SparkContext is not started for it); larger
    # batches go to executors once the session is up. 0: always executors
    driver_write_rows: int = 500_000
    # reader processes a bounded run's backlog is split between (spark/cdc_stream.py: cuts); 0: one
    # per core the driver may use, at most 8 (spark/cdc_stream.reader_count)
    readers: int = 0
    server_id: int = 0  # the replica id the binlog reader registers with (0: derived from the pipeline)
    # a table whose values changed without row events (spark/cdc_ddl.py) is re-copied by the
    # bootstrap's chunks on this many channels, in the driver up to driver_copy_rows
    recopy_channels: int = 2
    recopy_tables: int = 1  # tables re-copied at once, beside the stream
    recopy_record_speed: int | None = None  # rows/s per re-copy channel (spare a busy source), as a bootstrap's
    driver_copy_rows: int | None = None
    # the pipeline checks itself (spark/cdc_verify.py): every table slice by slice against the
    # source, once per verify_period seconds (0: only after a DDL, a re-copy, a takeover or a
    # stop, or with verify=True), using at most verify_budget of one source core for it;
    # mismatched slices repaired in place. 900 s: a divergence, whatever its cause, lives at most
    # a quarter of an hour, for about 1.3 µs of the source's CPU per row and pass (a 10M-row table:
    # 1.4 % of a core)
    verify_period: float = 900.0
    verify_budget: float = 0.1
    verify_after_ddl: bool = True
    verify: bool = False
    verify_every: float = 0.0  # earlier name of verify_period (used when set)
    reset: bool = False  # forget the checkpoint and start again from start_from_loads / start_position
    # rebuild the named tables' copies under their layout (the tableset's, core/clickhouse/layout.py):
    # each re-copied beside the stream into a new table, swapped in when done (spark/cdc_ddl.py)
    reshape: bool = False
    # the binlog a checkpoint needs is gone (purged; a new server without that history): "recopy"
    # restarts the stream at the source's position now and copies every table again beside it,
    # "stop" stops the pipeline (every retry too) until it is re-bootstrapped
    on_binlog_lost: str = "recopy"
    # a pipeline keeps the patterns it was first given (select) and applies them on every run; a
    # run giving other patterns is refused unless it says to change them
    change_selection: bool = False
    # what InnoDB changes without a binlog event (foreign-key cascades: core/cdc/foreign_keys.py,
    # spark/cdc_cascades.py) is derived and written at the parent's position; False only to
    # measure what it costs, or for a server that is known to log cascades (MySQL >= 9.6 is
    # detected). cascade_rows: the rows a batch's cascades may hold at once (the memory bound)
    follow_cascades: bool = True
    cascade_rows: int = 2_000_000
    # a source group (core/source/group.py): a pipeline per source (spark/cdc_group.py), its
    # tables merged as ``merge`` says (the group's runs in the driver or as long-running tasks on
    # the cluster's executors; a shard that leaves the group: its rows in the merged copy kept or
    # deleted)
    # one source's pipeline of a group (set by the group's run; in JSON its dict)
    group: GroupPart | None = None
    job: str = field(default="cdc_apply", init=False)

    def __post_init__(self):
        super().__post_init__()
        if not self.pipeline:
            raise ValueError("a CDC pipeline needs a name (pipeline=...)")
        if (self.lanes < 1 or self.batch_events < 1 or self.batch_bytes < 1 or self.readers < 0
                or self.driver_write_rows < 0):
            raise ValueError(f"pipeline {self.pipeline}: lanes, batch_events and batch_bytes must be >= 1, readers "
                             ">= 1 (0: from the driver's cores), driver_write_rows >= 0")
        if self.verify_every:
            self.verify_period = self.verify_every
        if self.reshape and not self.tableset.tables:
            raise ValueError(f"pipeline {self.pipeline}: reshape names the tables to rebuild (tables=[…]) and their "
                             "layout (layout=…)")
        _cdc_group(self)
        if self.reshape and (self.merge or (self.group and self.group.merged)):
            raise reshape_refused(self.pipeline, self.merge.into if self.merge else self.group.merge_into)
        if self.on_binlog_lost not in ("recopy", "stop"):
            raise ValueError(f"pipeline {self.pipeline}: on_binlog_lost must be 'recopy' or 'stop', "
                             f"not {self.on_binlog_lost!r}")
        if self.verify_period < 0 or not 0 < self.verify_budget <= 1:
            raise ValueError(f"pipeline {self.pipeline}: verify_period must be >= 0 seconds (0: only when due) and "
                             "verify_budget a fraction of one source core in (0, 1]")
        if not self.server_id:  # stable per pipeline, clear of the usual small server ids
            self.server_id = 100_000 + zlib.crc32(self.pipeline.encode()) % 2 ** 30

    def for_source(self, source: Source) -> "CdcApplySpec":
        """One source's pipeline of a group (its own lease, checkpoint, server and lag)."""
        return _part(self, source)


# rows per bootstrap chunk: each chunk is one consistent read (its read view held ~2 s at 250k
# rows/s per channel), streamed in batches, so its size bounds neither memory nor anything but what
# a crash re-reads; each costs a query, a snapshot and a ledger write (chunks of 100k: 16 % slower on 2M rows)
DEFAULT_CHUNK_ROWS = 500_000


@dataclass(kw_only=True)
class CdcBootstrapSpec(JobSpec):
    """Copy a pipeline's tables while the source keeps changing, and hand them to its catch-up.

    Each table is read in primary-key chunks (``chunk_rows``) inside the planner's shards,
    ``channels`` shards at a time, each chunk in a consistent snapshot of its own, written
    straight into the live target with its snapshot's version (docs/cdc-bootstrap.md). The
    table then joins ``pipeline`` from the binlog position its bootstrap began at.
    ``watermark_table`` (MySQL only, ``db.table`` the job may create and write) closes the
    snapshot-position window MySQL leaves open; MariaDB reports the exact position itself.
    """

    pipeline: str
    channels: int = 2
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    split_factor: int | None = None  # shards per channel; None: planning.auto_split_factor (a small table: 1)
    strategy: str = "balanced"
    batch_rows: int = 65536
    channel_record_speed: int | None = None
    channel_byte_speed: int | None = None
    watermark_table: str | None = None
    restart: bool = False  # start the tables' bootstraps again instead of resuming unfinished ones
    change_selection: bool = False  # replace the patterns the pipeline keeps (CdcApplySpec.change_selection)
    # set by the applier for a re-copy of a table it streams (spark/cdc_ddl.Recopies): the copy is
    # then the applier's to record, nothing is registered to join the pipeline
    recopy: bool = False
    driver_copy_rows: int | None = None  # as for a full load: tables copied by the driver's own channels
    # a source group, as CdcApplySpec's: every source's selected tables, merged as ``merge`` says
    group: GroupPart | None = None
    job: str = field(default="cdc_bootstrap", init=False)

    def __post_init__(self):
        super().__post_init__()
        if not self.pipeline:
            raise ValueError("a CDC bootstrap needs its pipeline's name (pipeline=...)")
        _cdc_group(self)
        if not self.tableset:
            raise ValueError(f"pipeline {self.pipeline}: name the tables to bootstrap (tables=['db.table', ...]) or "
                             "select them by pattern (select={'databases': [...], 'tables': [...]})")
        if self.chunk_rows < 1 or self.channels < 1:
            raise ValueError(f"pipeline {self.pipeline}: chunk_rows and channels must be >= 1")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")

    def for_source(self, source: Source) -> "CdcBootstrapSpec":
        return _part(self, source)

    def load_spec(self, table: dict, split_column: str) -> FullLoadSpec:
        """The table's copy as the ledger, reconciliation and re-import know it (a full load's
        spec): one load key per pipeline and table."""
        return FullLoadSpec(
            sources=self.sources, target=self.target, source_database=table["source_database"],
            source_table=table["source_table"], target_database=table["target_database"],
            target_table=table["target_table"], load_key=bootstrap_load_key(self.pipeline, table),
            channels=self.channels,
            batch_rows=self.batch_rows, columns=table.get("columns"), exclude_columns=table["exclude_columns"],
            split_column=split_column, split_factor=self.split_factor, strategy=self.strategy,
            channel_byte_speed=self.channel_byte_speed, channel_record_speed=self.channel_record_speed,
            ledger_database=self.ledger_database, failure_wait_seconds=self.failure_wait_seconds,
            tableset=self.tableset.one(table), hash_salt=self.hash_salt)


@dataclass(kw_only=True)
class SnapshotDiffSpec(JobSpec):
    """Compare an old snapshot (a ClickHouse table: the copy, ``FINAL``, deleted rows excluded)
    with a new one (the MySQL source table, read in the planner's shards, or another ClickHouse
    table) by key; flag every key identical / changed / new / deleted (core/verify/diff.py), write the
    change set to ClickHouse and, with ``on_change="apply"``, apply it to the old table with
    versions of the shared scheme.

    ``source`` is needed when the new side is MySQL (``source_table``) or to version an apply
    by the binlog; ``new_table`` ("db.table" on ClickHouse) replaces ``source_table``.
    """

    old_table: str  # "db.table" on ClickHouse
    source_database: str = ""
    source_table: str = ""
    new_table: str = ""  # "db.table" on ClickHouse, instead of a MySQL source table
    key_columns: list[str] | None = None  # default: the MySQL primary key / the old table's sorting key
    compare_columns: list[str] | None = None  # default: every non-key column
    ignore_columns: list[str] = field(default_factory=list)
    tolerances: dict = field(default_factory=dict)  # {column: abs | {"abs": x, "rel": y}} (floats)
    on_change: str = "warn"  # "fail" | "warn" | "apply"
    diff_key: str = ""  # the diff's name in the ledger and the change set (default: from the tables)
    changes_table: str = ""  # "db.table" (default: <old_table>__changes)
    channels: int = 2
    split_factor: int = 1  # shards per channel: the levels prune inside a shard, more shards only add queries
    split_column: str | None = None
    bucket_rows: int = 50_000  # the most rows one comparison holds (per side)
    fetch_rows: int = 10_000
    reader: str = "auto"  # how large reads of MySQL rows go: as FullLoadSpec.reader
    sample_rows: int = 20  # per flag, in the HTML report
    report_dir: str = ""
    # many tables: each selected MySQL table against its copy (``old_table`` unused), ``diff_key``
    # a prefix (:func:`table_key`)
    # a source group (core/source/group.py): with ``merge``, every member's table against the
    # merged copy's rows of it (key: the primary key and the source columns); else side by side
    member: dict | None = None  # one member's diff (set by the group's run)
    job: str = field(default="snapshot_diff", init=False)
    side_by_side: ClassVar[str] = SIDE_BY_SIDE

    def __post_init__(self):
        super().__post_init__()
        if self.reader not in READERS:
            raise ValueError(f"reader must be one of {READERS}, got {self.reader!r}")
        if not self.grouped:  # a group's parts (one source each) check theirs
            _check_reader(self.reader, self.source, self.source_table or self.new_table)
        if _group(self):
            if self.on_change not in ("fail", "warn", "apply"):
                raise ValueError(f"on_change must be 'fail', 'warn' or 'apply', got {self.on_change!r}")
            if self.merge:
                self.diff_key = self.diff_key or f"diff:group->{self.merge.into}"
                self.changes_table = self.changes_table or f"{self.merge.into}__changes"
            return
        if self.tableset:
            if self.source is None or self.new_table:
                raise ValueError("a diff of tables by select=/tables= compares MySQL tables (source) with their copies")
            return
        if self.on_change not in ("fail", "warn", "apply"):
            raise ValueError(f"on_change must be 'fail', 'warn' or 'apply', got {self.on_change!r}")
        if bool(self.source_table) == bool(self.new_table):
            raise ValueError("give the new snapshot as source_database/source_table (MySQL) or new_table "
                             "(ClickHouse), exactly one")
        if self.source_table and self.source is None:
            raise ValueError(f"table {self.source_database}.{self.source_table}: a MySQL source needs its endpoint")
        for name in ("old_table", "new_table", "changes_table"):
            value = getattr(self, name)
            if value and "." not in value:
                raise ValueError(f"{name} {value!r}: give it as database.table")
        if self.channels < 1 or self.bucket_rows < 1:
            raise ValueError("channels and bucket_rows must be at least 1")
        self.diff_key = self.diff_key or f"diff:{self.new_name}->{self.old_table}"
        self.changes_table = self.changes_table or f"{self.old_table}__changes"

    @property
    def new_name(self) -> str:
        return self.new_table or f"{self.source_database}.{self.source_table}"

    def for_member(self, member: Member, endpoint: MySQLEndpoint, table: dict | None = None) -> "SnapshotDiffSpec":
        """One source table of a merged copy against the copy's rows of it (``table``: its
        table_config, unused: a diff compares every column the copy holds)."""
        return dataclasses.replace(
            self, sources=one_server(endpoint), merge=None, tableset=self.tableset.merged_member(),
            member=dataclasses.asdict(member),
            source_database=member.database, source_table=member.table, old_table=self.merge.into,
            diff_key=member_key(self.diff_key, member))

    def for_table(self, table: dict) -> "SnapshotDiffSpec":
        return dataclasses.replace(
            self, tableset=self.tableset.one(table),
            source_database=table["source_database"],
            source_table=table["source_table"], old_table=f"{table['target_database']}.{table['target_table']}",
            diff_key=f"{self.diff_key}:{table['source_database']}.{table['source_table']}" if self.diff_key else "",
            changes_table="")


def _group(spec) -> bool:
    """A spec of a source group: checked here; its tables are resolved per source."""
    if not spec.grouped:
        return False
    if not spec.tableset:
        raise ValueError("a source group applies one table selection to every source: give select= (patterns) "
                         "and/or tables=")
    return True


def _cdc_group(spec) -> None:
    """A CDC spec of a source group: its pipeline's name checked (the part of one source needs none);
    a part's group record typed (a spec read from JSON carries its dict)."""
    spec.group = GroupPart.of(spec.group)
    if not spec.grouped:
        return
    if "@" in spec.pipeline:
        raise ValueError(f"pipeline {spec.pipeline!r}: a group's name may not hold '@' (its sources' pipelines are "
                         "named <pipeline>@<source>)")


def _part(spec, source: Source):
    """A group CDC spec's part for ``source``: the source's pipeline ``<pipeline>@<source>``, its
    tables the group's (merged ones point at the merged copy)."""
    group = GroupPart(spec.pipeline, source.name, tuple(s.name for s in spec.sources),
                      spec.merge.into if spec.merge else "", spec.merge.on_shard_removed if spec.merge else "keep")
    extra = {"server_id": 0} if hasattr(spec, "server_id") else {}
    return dataclasses.replace(spec, sources=one_server(source.endpoint), merge=None,
                               pipeline=part_pipeline(spec.pipeline, source.name), group=group, **extra)


def member_key(prefix: str, member: Member) -> str:
    """A merged copy's member load key: ``<group key>:<source>:<db>.<table>``."""
    return f"{prefix}:{member.name}"


def _check_reader(reader: str, source: MySQLEndpoint | None, table: str) -> None:
    """The Arrow-native reader (connectorx) has no TLS: refused for a source that asks for it."""
    if reader == "native" and source is not None and source.ssl_mode != "DISABLED":
        raise ValueError(f"table {table}: reader='native' (connectorx) cannot connect with TLS, and {source.address} "
                         "asks for it; use reader='auto' (it reads such a source with mysqlclient) or 'mysqlclient'")


def table_key(prefix: str, table: dict) -> str:
    """A selected table's load key: ``<prefix>:<db>.<table>``, or without a prefix the key a
    one-table load of it gets by default."""
    name = f"{table['source_database']}.{table['source_table']}"
    return f"{prefix}:{name}" if prefix else f"{name}->{table['target_database']}.{table['target_table']}"


def bootstrap_load_key(pipeline: str, table: dict) -> str:
    return f"cdc:{pipeline}:{table['source_database']}.{table['source_table']}"


def copied_schema(conn, spec: dict, salt: bytes = b"", writer: str = "") -> TableSchema:
    """The source table as a load copies it (its ``columns`` / ``exclude_columns``, shaped by its
    content settings with ``salt``: core/content/); ``spec`` is a full load's spec as a dict (the
    ledger keeps it in that form), or a pipeline table's entry — of a merged copy's member, seen
    through its ``view`` (core/source/group.refresh_view). ``writer``: the path asking, when it
    writes a history (core/content/shaping.refuse_history)."""
    schema = read_table_schema(conn, spec["source_database"], spec["source_table"])
    schema = schema.select(spec.get("columns"), spec.get("exclude_columns") or ())
    content = spec["content"] if "content" in spec else TableSet.of(spec.get("tableset")).content_of()
    schema = schema.shaped(content, salt, writer)
    if "view" in spec:  # a pipeline table of a merged copy (PipelineTable.copy_spec)
        view = spec["view"]
        schema = refresh_view(TableSchema(schema.database, schema.table, tuple(MySQLColumn(**c) for c in view["shape"]),
                                          tuple(view["key"])) if view else tags_view(Member.of(spec["member"])),
                              schema)
    return schema
