"""A copy's content settings, :class:`Content`: column transforms, a standing row filter, the
delete rule and the history table (:class:`HistorySettings`) — one more type a
:class:`~airflow_sync_provider.core.selection.TableSet` carries (a job's default, a table's entry,
a selection), as it carries a layout.

The settings take effect through the table as copied (core/source/schema.TableSchema.shaped):
its column mappings carry their transforms, so every reader and writer (load, bootstrap chunk,
binlog row image, repair) and every check (reconcile, diff, rolling verification) that works from
the mappings shapes values the same way; its plan reads only the rows the filter selects; CDC
decides on each row image (core/cdc/binlog/routes.py). The settings a copy was made with are kept
in its table comment (:func:`content_comment`), with a fingerprint of the salt, never the salt:
a job asking for others is refused (:func:`check_same`).

``history`` (issue 61, docs/design/history-tables.md) is parsed, carried and kept like the other
settings; a job whose path does not write a history yet refuses a table that asks for one
(:func:`refuse_history`, from ``TableSchema.shaped``), so no copy gets a history with holes that
looks complete.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from airflow_sync_provider.core.content import ContentError
from airflow_sync_provider.core.content.transforms import Transform

ON_DELETE = ("delete", "keep")
OPTIONS = ("transform", "row_filter", "on_delete", "history")
HISTORY_OPTIONS = ("partition_by", "retention_days", "snapshots")
SNAPSHOTS = ("changes", "all")  # what a load writes into a history: the rows it changes, or every row
# a kept row's mark: when the source deleted it (its commit time, UTC); 0 while it lives
DELETED_AT_SOURCE = "_deleted_at_source"


def _transforms(value, where: str) -> tuple[tuple[str, str], ...]:
    if isinstance(value, (list, tuple)):  # ["col=fn", …] as the command line gives them
        pairs = {}
        for item in value:
            name, sep, fn = str(item).partition("=")
            if not sep or not name.strip():
                raise ContentError(f"{where}transform {item!r}: give COLUMN=FUNCTION, e.g. email=hash")
            pairs[name.strip()] = fn.strip()
        value = pairs
    if not isinstance(value, dict):
        raise ContentError(f"{where}transform: give a dict of column -> function, not {value!r}")
    return tuple(sorted((str(column), Transform.parse(str(fn)).spec()) for column, fn in value.items()))


@dataclass(frozen=True)
class HistorySettings:
    """A copy's history table, ``<table>_history`` (core/clickhouse/history.py): every version of every
    row. ``partition_by``: its PARTITION BY (default the month of the source's commit time,
    core/clickhouse/history.DEFAULT_PARTITION); ``retention_days``: versions older than this many days
    (by commit time) expire (0: kept for ever); ``snapshots``: what a load (a write without a
    binlog) adds, ``"changes"`` — the rows whose values the history's newest version lacks — or
    ``"all"``, every row it read (a snapshot event per key per load)."""

    partition_by: str = ""
    retention_days: int = 0
    snapshots: str = "changes"

    @classmethod
    def of(cls, value, where: str = "") -> "HistorySettings | None":
        """``True`` (the defaults), a dict of :data:`HISTORY_OPTIONS`, or ``None`` / ``False`` (no history)."""
        if value is None or value is False:
            return None
        if isinstance(value, HistorySettings):
            return value
        if value is True:
            return cls()
        if not isinstance(value, dict):
            raise ContentError(f"{where}history: give True or a dict of {list(HISTORY_OPTIONS)}, not {value!r}")
        unknown = sorted(set(value) - set(HISTORY_OPTIONS))
        if unknown:
            raise ContentError(f"{where}history: unknown option(s) {unknown}; the options are {list(HISTORY_OPTIONS)}")
        partition_by = value.get("partition_by") or ""
        if not isinstance(partition_by, str):
            raise ContentError(f"{where}history partition_by: give a ClickHouse expression as text, not "
                               f"{partition_by!r}")
        days = value.get("retention_days") or 0
        if isinstance(days, bool) or not isinstance(days, int) or days < 0:
            raise ContentError(f"{where}history retention_days={days!r}: give a whole number of days >= 1 "
                               "(or leave it out: kept for ever)")
        snapshots = value.get("snapshots") or "changes"
        if snapshots not in SNAPSHOTS:
            raise ContentError(f"{where}history snapshots={snapshots!r}: give one of {list(SNAPSHOTS)}")
        return cls(partition_by.strip(), days, snapshots)

    def to_dict(self) -> "dict | bool":
        """``True`` for the defaults, else the options that differ from them (the form :meth:`of` reads)."""
        out = {**({"partition_by": self.partition_by} if self.partition_by else {}),
               **({"retention_days": self.retention_days} if self.retention_days else {}),
               **({"snapshots": self.snapshots} if self.snapshots != "changes" else {})}
        return out or True


HISTORY_SUFFIX = "_history"  # a copy's history is <table>_history (core/clickhouse/history.py)
# the paths that write a copy's history so far (issue 61, docs/design/history-tables.md §5): the CDC
# stream's row changes (slice 2); a full load of one server's table, reconcile's re-import and the
# snapshot diff's apply (slice 4). Every other writer (the bootstrap, re-copies, source groups, XA
# staging, cascades, TRUNCATE and DDL) is refused for a copy with a history until its slice.
HISTORY_WRITERS = ("cdc", "load", "reconcile", "diff")


def refuse_history(content: "Content", table: str, writer: str = "") -> None:
    """A job asked for a history stops before it writes anything unless ``writer`` (the path that
    asks) writes a history: rather than a copy whose history is empty or has holes. The one place
    this is decided: every job reads the table it copies, compares or follows through
    ``TableSchema.shaped``, which calls this; the CDC stream's routes (and the verification, which
    only reads) pass ``writer="cdc"``. A slice that makes a path write history adds it to
    :data:`HISTORY_WRITERS`."""
    if HistorySettings.of(content.history) is not None and writer not in HISTORY_WRITERS:
        raise ContentError(f"table {table}: history tables are written so far by the CDC stream, full loads of one "
                           "server's table, reconcile's re-import and the snapshot diff's apply (issue 61): this job "
                           "(a CDC bootstrap or re-copy, or a source group's load, diff or reconciliation) does not "
                           "write them yet. Nothing was written. Load the table with a full load instead (a pipeline "
                           "following a copy keeps its history from there), or leave history out of this job's "
                           "content settings")


@dataclass(frozen=True)
class Content:
    """What a copy holds; every default is the mirror's (every row and column as MySQL has them,
    a delete at the source deletes the copy's row)."""

    transform: tuple[tuple[str, str], ...] = ()  # (column, transform spec), sorted
    row_filter: str = ""  # a MySQL boolean expression (core/content/row_filter.py)
    on_delete: str = "delete"
    history: "HistorySettings | None" = None  # the copy's history table (None: none)

    @classmethod
    def of(cls, value: "Content | dict | None", where: str = "") -> "Content":
        """Content settings from their dict form; an unknown option is refused by name."""
        if isinstance(value, Content):
            return value
        value = dict(value or {})
        unknown = sorted(set(value) - set(OPTIONS))
        if unknown:
            raise ContentError(f"{where}content: unknown option(s) {unknown}; the options are {list(OPTIONS)}")
        on_delete = value.get("on_delete") or "delete"
        if on_delete not in ON_DELETE:
            raise ContentError(f"{where}on_delete={on_delete!r}: give one of {list(ON_DELETE)}")
        row_filter = value.get("row_filter") or ""
        if not isinstance(row_filter, str):
            raise ContentError(f"{where}row_filter: give a MySQL boolean expression as text, not {row_filter!r}")
        return cls(_transforms(value.get("transform") or {}, where), row_filter.strip(), on_delete,
                   HistorySettings.of(value.get("history"), where))

    def to_dict(self) -> dict:
        """The options that differ from the mirror's, in the form :meth:`of` reads."""
        out: dict = {}
        if self.transform:
            out["transform"] = dict(self.transform)
        if self.row_filter:
            out["row_filter"] = self.row_filter
        if self.on_delete != "delete":
            out["on_delete"] = self.on_delete
        history = HistorySettings.of(self.history)  # a Content(…) built directly may hold True or a dict
        if history is not None:
            out["history"] = history.to_dict()
        return out

    def __bool__(self) -> bool:
        return bool(self.to_dict())

    @property
    def keep_deletes(self) -> bool:
        return self.on_delete == "keep"

    @property
    def hashes(self) -> bool:
        """Does a column need the salt?"""
        return any(Transform.parse(fn).name == "hash" for _, fn in self.transform)

    def describe(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True) if self else "the source's rows and values as they are"

    def merged(self, over: "Content | dict | None") -> "Content":
        """These settings with ``over``'s (a table's entry over the job's): transforms by column,
        the filter, the delete rule and the history when given."""
        over = Content.of(over)
        return Content(tuple(sorted({**dict(self.transform), **dict(over.transform)}.items())),
                       over.row_filter or self.row_filter,
                       over.on_delete if over.on_delete != "delete" else self.on_delete,
                       over.history if over.history is not None else self.history)


NONE = Content()


def describe_content(content: "Content | dict") -> str:
    """A copy's content settings in a line, for people (cdc status, the Sync view)."""
    content = Content.of(content)
    parts = [", ".join(f"{column}: {fn}" for column, fn in content.transform)] if content.transform else []
    if content.row_filter:
        parts.append(f"rows where {content.row_filter}")
    if content.keep_deletes:
        parts.append("deletes kept (_deleted_at_source)")
    history = HistorySettings.of(content.history)
    if history is not None:
        parts.append("every version kept in <table>_history" + (
            f" ({history.retention_days} days)" if history.retention_days else ""))
    return "; ".join(parts) or "every row and value as the source has them"


def salt_fingerprint(salt: bytes) -> str:
    """Which salt a copy's hashes were made with, without the salt: the first 64 bits of a SHA-256
    over a label and the salt (a copy hashed under one salt never takes rows hashed under another)."""
    return hashlib.sha256(b"airflow-sync salt fingerprint\0" + salt).hexdigest()[:16]


# --- the settings a copy keeps in its comment ----------------------------------------------------

_MARK = " content="


def content_comment(content: Content, salt: bytes = b"") -> str:
    """What a copy's comment carries of its content settings: nothing for the mirror's."""
    if not content:
        return ""
    data = content.to_dict()
    if content.hashes:
        data["salt"] = salt_fingerprint(salt)
    return _MARK + json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def stored(comment: str) -> tuple[Content, str]:
    """The content settings and salt fingerprint a copy's comment records (none: the mirror's)."""
    at = (comment or "").find(_MARK)
    if at < 0:
        return NONE, ""
    data, _ = json.JSONDecoder().raw_decode(comment, at + len(_MARK))
    fingerprint = data.pop("salt", "")
    return Content.of(data), fingerprint


def restored(comment: str, content: Content) -> str:
    """``comment`` recording ``content`` instead of the content settings it records (its salt's
    fingerprint kept: the copy's hashed values stay what they are), the rest of it unchanged."""
    at = (comment or "").find(_MARK)
    end, fingerprint = at, ""
    if at >= 0:
        data, end = json.JSONDecoder().raw_decode(comment, at + len(_MARK))
        fingerprint = data.get("salt", "")
    else:  # before a working table's marker (core/clickhouse/described.working_marker), as ddl.py writes it
        at = end = comment.find(" load=") if " load=" in (comment or "") else len(comment or "")
    data = content.to_dict() | ({"salt": fingerprint} if fingerprint else {})
    text = _MARK + json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if data else ""
    return (comment or "")[:at] + text + (comment or "")[end:]


def check_same(table: str, requested: Content, salt: bytes, comment: str) -> None:
    """Refuse a job whose content settings (or salt) differ from the copy's."""
    have, fingerprint = stored(comment)
    # a job that writes no history (a load, a bootstrap, a re-import, a diff) into a copy that keeps one
    if have != requested and have.history and not requested.history and \
            dataclasses.replace(have, history=None) == requested:
        raise ContentError(f"table {table}: its copy keeps a history ({table}{HISTORY_SUFFIX}), which this job's "
                           "content settings leave out; it would change the copy behind the history's back, so it "
                           "stops before writing anything. Ask for the copy's history settings (history=...): the "
                           "CDC stream, full loads, reconcile's re-import and the diff's apply write it (issue 61)")
    if have != requested:
        raise ContentError(f"table {table}: the copy holds {have.describe()} but this job asks for "
                           f"{requested.describe()}; change a copy's content with airflow-sync reshape (or drop "
                           "the copy and load it again)")
    if requested.hashes and fingerprint and fingerprint != salt_fingerprint(salt):
        raise ContentError(f"table {table}: the copy's hashed columns were made with another salt than this job's; "
                           "give the salt the copy was made with (rows hashed under two salts never match)")
