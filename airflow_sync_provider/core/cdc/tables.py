"""A pipeline's tables as the applier knows them, carried with every checkpoint.

:class:`PipelineTable` is one table of a pipeline: what a bootstrap or a full load gave it
(source and target names, the columns copied, the split column) and what the applier learned
while it streamed (its shape at the checkpoint, a re-copy under way, why it left, its
verifications). The pipeline state (core/cdc/checkpoints.py) holds the whole list and writes
it with every checkpoint, so a run resuming from a checkpoint knows each table exactly as it
was there — a field that was cleared stays cleared.

:class:`Registration` is a table waiting to join: a bootstrap (or a full load given to
``start_from_loads``) registers it with the position its copy began at (``since``); the
applier replays that table alone up to its checkpoint and then takes it into the stream.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from airflow_sync_provider.core.clickhouse.layout import Layout
from airflow_sync_provider.core.content.shaping import Content
from airflow_sync_provider.core.positions import BinlogPosition
from airflow_sync_provider.core.source.schema import TableSchema
from airflow_sync_provider.core.typemap import MySQLColumn


@dataclass
class PipelineTable:
    # what the table's copy is: names, the columns copied, the split column (a full load split on
    # a collated string keeps each row's collation weight, and so must CDC)
    source_database: str
    source_table: str
    target_database: str = ""
    target_table: str = ""
    columns: list[str] | None = None
    exclude_columns: list[str] = field(default_factory=list)
    split_column: str | None = None
    layout: Layout | None = None  # the layout a copy made for it is given (a reshape's: core/clickhouse/layout.py)
    content: Content | None = None  # what its copy holds (core/content/shaping.py: its comment says)
    by_selection: bool = False  # joined because the pipeline's patterns select it
    # a member of a merged copy (core/source/group.py: source, database, table): its shape is the
    # member's view (columns it lacks absent, the source columns its tags); a change the merged
    # copy follows only once every shard has made it, which this one waits at (core/cdc/alter.py)
    member: dict | None = None
    waiting: dict | None = None
    # what the applier learned while it streamed
    shape: list[dict] | None = None  # its columns as copied at the checkpoint (MySQLColumn fields)
    key: list[str] | None = None  # its primary key there
    collation: str | None = None  # its default collation (for columns a DDL gives none)
    skip_before: int = 0  # changes ranked below this are covered by a re-copy from there
    left: str = ""  # why it no longer streams ("" while it does)
    unstreamable: str = ""  # why CDC cannot stream it now (it is also ``left``)
    # a re-copy under way: reason, position, started; under a new primary key also ``into``, the
    # copy ordered by it that is swapped in when done
    recopying: dict | None = None
    recopies: int = 0
    last_recopy: dict | None = None
    # its checks against the source (spark/cdc_verify.py): due since (a DDL, a TRUNCATE, a re-copy,
    # a takeover, a stop: its next pass starts at once), the pass under way, the last one done
    due_since: float = 0.0
    verify_pass: dict | None = None
    verified: dict | None = None
    verifications: int = 0  # passes done
    repaired: int = 0  # slices repaired in total

    def __post_init__(self):
        self.target_database = self.target_database or self.source_database
        self.target_table = self.target_table or self.source_table
        self.exclude_columns = list(self.exclude_columns or [])

    @property
    def name(self) -> str:
        return f"{self.source_database}.{self.source_table}"

    @property
    def streaming(self) -> bool:
        return not self.left

    @property
    def writes_to(self) -> str:
        """The ClickHouse table its rows go to: the copy, or while it is re-copied under a new
        primary key, the copy ordered by that key that replaces it when done."""
        return (self.recopying or {}).get("into") or self.target_table

    def copy_spec(self) -> dict:
        """The table as a load copies it (core/jobspec.copied_schema, a bootstrap's table)."""
        return {"source_database": self.source_database, "source_table": self.source_table,
                "target_database": self.target_database, "target_table": self.writes_to,
                "columns": self.columns, "exclude_columns": list(self.exclude_columns),
                "split_column": self.split_column, "layout": _dict(self.layout), "content": _dict(self.content),
                # a member of a merged copy is seen through its view (none yet: its source columns)
                **({"member": self.member, "view": {"shape": self.shape, "key": self.key} if self.shape else None}
                   if self.member else {})}

    def remember_shape(self, schema: TableSchema) -> None:
        shape = schema.shape()
        self.shape, self.key = shape["shape"], shape["key"]

    def schema(self) -> TableSchema | None:
        """The shape it had at the checkpoint (None before the applier first saw it)."""
        if not self.shape:
            return None
        return TableSchema(self.source_database, self.source_table, tuple(MySQLColumn(**c) for c in self.shape),
                           tuple(self.key or ()))

    @property
    def verify_due(self) -> bool:
        """Marked due since its last pass began."""
        return self.due_since > (self.verified or {}).get("started", 0.0)

    def mark_due(self) -> None:
        self.due_since = time.time()

    def leave(self, why: str, unstreamable: bool = False) -> None:
        self.left = why
        self.unstreamable = why if unstreamable else ""

    def rejoin(self) -> None:
        self.left = self.unstreamable = ""

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "layout": _dict(self.layout), "content": _dict(self.content)}

    @classmethod
    def from_dict(cls, data: dict) -> "PipelineTable":
        """From the ledger (unknown keys of other releases are ignored; ``None``s of fields that
        are never None take their defaults)."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["layout"] = Layout.of(values["layout"]) if values.get("layout") else None
        values["content"] = Content.of(values["content"]) if values.get("content") else None
        for name in ("left", "unstreamable"):
            values[name] = values.get(name) or ""
        for name in ("skip_before", "recopies", "verifications", "repaired"):
            values[name] = values.get(name) or 0
        if data.get("verify_due") and not values.get("due_since"):  # an entry of an earlier release
            values["due_since"] = 1.0
        values["due_since"] = values.get("due_since") or 0.0
        return cls(**values)

    @classmethod
    def of(cls, table) -> "PipelineTable":
        """``"db.table"``, a dict (a table config, a ledger entry) or a PipelineTable."""
        if isinstance(table, PipelineTable):
            return dataclasses.replace(table)
        if isinstance(table, str):
            database, _, name = table.partition(".")
            if not name:
                raise ValueError(f"table {table!r}: give it as database.table")
            return cls(database, name)
        return cls.from_dict(table)


@dataclass
class Registration:
    """A table registered to join a pipeline: its copy began at ``since``; ``joined`` once the
    applier has replayed it up to its checkpoint and streams it."""

    table: PipelineTable
    since: BinlogPosition | None
    joined: bool = False

    @property
    def name(self) -> str:
        return self.table.name


def _dict(value: Layout | Content | None) -> dict | None:
    """A layout or content setting as the ledger and a job spec hold it."""
    return value.to_dict() or None if value is not None else None
