"""DDL on replicated tables, as the binlog says it (patent S3; docs/cdc.md, "Schema changes"):
the statements parsed, column definitions probed in MySQL; what each change does to a copy is
decided in one place, core/cdc/alter.py.

A table's shape at each binlog position is its shape at the previous DDL changed by the DDL
statement itself — parsed with sqlglot, never guessed from the source's *current* definition
(a catch-up far behind would see later columns early). Every DDL on a replicated table is
one of:

* **followed in place**: the copy gets the same change in ClickHouse, existing rows included —
  a column added with a constant default (MySQL itself evaluates the default, see
  :func:`probe_column`; ClickHouse stores it for the existing rows), dropped, renamed, widened
  (every old value fits the new type unchanged), a default set or dropped, an index, an option
  or a rebuild (``FORCE``, ``ENGINE=``) that changes no value, ``TRUNCATE`` (a tombstone for
  every row, ranked at the statement's position);
* **followed by a re-copy**: the change alters stored values without row events, in a way
  ClickHouse cannot reproduce exactly (a per-row or time-dependent default, a generated
  column, a value-changing MODIFY, a table renamed onto the name, a statement the parser does
  not understand): the applier re-copies the table with the bootstrap's chunks, at the source's
  position *now*, with the definition it has now (both of the same moment), and skips the table's
  older events (every one of them is out-ranked by the re-copy's rows or removed with the rows
  older than it);
* **leaving**: the table is dropped or renamed away; its copy is kept as it was;
* **re-keyed**: a primary key change (the copy is keyed and sorted by it): nothing is changed
  in place; the table is re-copied beside the stream into a copy ordered by the new key, which is
  then swapped in (spark/cdc_ddl.Recopies).

The rows events' own column names (``binlog_row_metadata=FULL``) are checked against the
tracked shape (core/cdc/binlog/), so a shape this module got wrong stops the pipeline
instead of copying wrong values.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Decimal

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError
from sqlglot.tokens import TokenType

from airflow_sync_provider.core.sql import ch_string, mysql_ident, mysql_table
from airflow_sync_provider.core.typemap import MySQLColumn, map_column

# --- what a statement does -------------------------------------------------------------------

ADD, DROP, RENAME, CHANGE, KEEP, KEY, RECOPY = "add", "drop", "rename", "change", "keep", "key", "recopy"


@dataclass(frozen=True)
class Action:
    """One clause of an ALTER TABLE: ``kind`` is one of the constants above."""

    kind: str
    column: str = ""  # the column it acts on (the old name for rename / change)
    new_name: str = ""
    definition: str = ""  # the column definition (add / change), without FIRST / AFTER
    note: str = ""


@dataclass(frozen=True)
class Statement:
    """A DDL statement as it touches tables: ``kind`` alter | truncate | rename | drop | create."""

    kind: str
    tables: tuple[str, ...]  # db.table names, in the statement's order
    actions: tuple[Action, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()  # (from, to) for RENAME TABLE / ALTER … RENAME TO


_DDL_WORDS = {"ALTER", "RENAME", "DROP", "TRUNCATE", "CREATE"}


_MYSQL = Dialect.get_or_raise("mysql")


def _tokens(statement: str):
    try:
        tokens = _MYSQL.tokenize(statement)
    except Exception:  # sqlglot's TokenError: not a statement we could act on
        return []
    if tokens and tokens[0].token_type == TokenType.RENAME and len(tokens) == 2:
        # sqlglot keeps RENAME's arguments as one string: tokenize them too
        return [tokens[0], *_tokens(statement[tokens[0].end + 1:])]
    return tokens


def name_at(tokens, i: int, default_schema: str) -> tuple[str, int]:
    """The possibly qualified table name starting at token ``i``: (``db.table``, next index)."""
    parts = [tokens[i].text]
    i += 1
    while i + 1 < len(tokens) and tokens[i].token_type == TokenType.DOT:
        parts.append(tokens[i + 1].text)
        i += 2
    return (".".join(parts) if len(parts) > 1 else f"{default_schema}.{parts[0]}"), i


def _qualified(table: exp.Table, default_schema: str) -> str:
    return f"{table.db or default_schema}.{table.name}"


def parse(statement: str, default_schema: str) -> Statement | None:
    """What ``statement`` does to tables; None when it is not DDL on a table."""
    tokens = _tokens(statement)
    words = [t.text.upper() for t in tokens[:4]]
    if not words or words[0] not in _DDL_WORDS:
        return None
    if words[0] == "ALTER" and len(words) > 2 and words[1] in ("ONLINE", "IGNORE"):
        # MariaDB's ALTER ONLINE / IGNORE: same clauses; sqlglot knows only the plain form
        statement = statement[:tokens[1].start] + statement[tokens[1].end + 1:]
        tokens, words = _tokens(statement), ["ALTER", *words[2:]]
    if words[0] == "RENAME" and len(words) > 1 and words[1] == "TABLE":
        return _rename_tables(tokens, default_schema)
    if words[0] != "TRUNCATE" and (len(words) < 2 or "TABLE" not in words[1:3]):
        return None  # a database, a view, an index, a user …
    if words[0] == "DROP" and words[1] == "TEMPORARY" or words[0] == "CREATE" and words[1] == "TEMPORARY":
        return None
    try:
        tree = sqlglot.parse_one(statement, read="mysql", error_level=sqlglot.ErrorLevel.RAISE)
    except ParseError:
        tree = None
    if isinstance(tree, exp.TruncateTable):
        return Statement("truncate", tuple(_qualified(t, default_schema) for t in tree.expressions))
    if isinstance(tree, exp.Drop) and (tree.args.get("kind") or "").upper() == "TABLE":
        return Statement("drop", tuple(_qualified(t, default_schema) for t in tree.args.get("tables") or []))
    if isinstance(tree, exp.Create) and (tree.args.get("kind") or "").upper() == "TABLE":
        table = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
        return Statement("create", (_qualified(table, default_schema),))
    if words[0] == "ALTER":
        name, _ = name_at(tokens, 2, default_schema)
        if not isinstance(tree, exp.Alter):  # sqlglot fell back to a bare command: not understood
            return Statement("alter", (name,), (Action(RECOPY, note="statement not understood by the parser"),))
        return _alter(tree, name, default_schema)
    # TRUNCATE / DROP / CREATE that sqlglot could not parse: the table name from the tokens
    words = [t.text.upper() for t in tokens]
    i = 2 if words[1] == "TABLE" else 1
    i += 2 if words[i:i + 2] == ["IF", "EXISTS"] else 3 if words[i:i + 3] == ["IF", "NOT", "EXISTS"] else 0
    name, _ = name_at(tokens, min(i, len(tokens) - 1), default_schema)
    return Statement({"TRUNCATE": "truncate", "DROP": "drop", "CREATE": "create"}[words[0]], (name,))


def _rename_tables(tokens, default_schema: str) -> Statement:
    """``RENAME TABLE a TO b, c TO d`` (sqlglot keeps it as a bare command)."""
    renames, i = [], 2
    while i < len(tokens):
        source, i = name_at(tokens, i, default_schema)
        if i >= len(tokens) or tokens[i].text.upper() != "TO":
            break
        target, i = name_at(tokens, i + 1, default_schema)
        renames.append((source, target))
        i += 1  # the comma
    return Statement("rename", tuple(name for pair in renames for name in pair), renames=tuple(renames))


def _definition(column: exp.ColumnDef) -> str:
    """The definition MySQL evaluates in a probe table: without FIRST / AFTER (the copy addresses
    columns by name) and AUTO_INCREMENT (it needs a key there, and changes no stored value)."""
    column = column.copy()
    column.set("position", None)
    column.set("constraints", [c for c in column.constraints
                               if not isinstance(c.kind, exp.AutoIncrementColumnConstraint)])
    return column.sql(dialect="mysql")


def _sets_key(column: exp.ColumnDef) -> bool:
    return any(isinstance(c.kind, exp.PrimaryKeyColumnConstraint) for c in column.constraints)


def _alter(tree: exp.Alter, name: str, default_schema: str) -> Statement:
    actions, renames = [], []
    for action in tree.args.get("actions") or []:
        if isinstance(action, exp.ColumnDef):
            actions.append(Action(KEY, action.name, note="primary key") if _sets_key(action)
                           else Action(ADD, action.name, definition=_definition(action)))
        elif isinstance(action, exp.Drop):
            kind = (action.args.get("kind") or "").upper()
            if kind == "COLUMN":
                actions += [Action(DROP, column.name) for column in action.args.get("tables") or []]
            else:
                actions.append(Action(KEEP, note=f"DROP {kind}"))
        elif isinstance(action, exp.RenameColumn):
            actions.append(Action(RENAME, action.this.name, action.args["to"].name))
        elif isinstance(action, exp.ModifyColumn):
            column = action.this
            old = action.args.get("rename_from")
            if _sets_key(column):
                actions.append(Action(KEY, column.name, note="primary key"))
                continue
            actions.append(Action(CHANGE, old.name if old is not None else column.name, column.name,
                                  _definition(column)))
        elif isinstance(action, exp.AlterColumn):
            actions.append(Action(KEEP, action.name, note="default or visibility"))
        elif isinstance(action, exp.DropPrimaryKey) or (
                isinstance(action, exp.AddConstraint) and action.find(exp.PrimaryKey) is not None):
            actions.append(Action(KEY, note="primary key"))
        elif isinstance(action, (exp.AddConstraint, exp.ForceProperty)):
            actions.append(Action(KEEP, note=type(action).__name__))
        elif isinstance(action, exp.AlterRename):
            renames.append((name, _qualified(action.this, default_schema)))
        else:  # a clause this module does not know: re-copy rather than guess
            actions.append(Action(RECOPY, note=f"clause {action.sql(dialect='mysql')[:80]!r}"))
    tables = (name, *(target for _, target in renames))
    return Statement("alter", tables, tuple(actions), tuple(renames))


# --- MySQL evaluates a column definition -------------------------------------------------------

NOT_CONSTANT = object()  # the existing rows' values differ per row, or depend on time or randomness
_PROBE = "_airflow_sync_probe"
_LENGTH = re.compile(r"^[a-z]+\((\d+)(?:,(\d+))?\)")


class ProbeFailed(RuntimeError):
    pass


def _column_from_show(conn, field: str, type_: str, collation: str | None, null: str) -> MySQLColumn:
    """A :class:`MySQLColumn` as information_schema would give it, from SHOW FULL COLUMNS (the
    only place a temporary table's columns are shown)."""
    data_type = re.match(r"[a-z]+", type_.lower()).group(0)
    numbers = _LENGTH.match(type_.lower())
    first, second = (int(numbers.group(1)), int(numbers.group(2)) if numbers.group(2) else None) if numbers \
        else (None, None)
    charset = None
    if collation:
        with conn.cursor() as cur:
            cur.execute("SELECT CHARACTER_SET_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME = %s",
                        (collation,))
            row = cur.fetchone()
            charset = row[0] if row else None
    return MySQLColumn(
        name=field, data_type=data_type, column_type=type_, nullable=null == "YES",
        precision=first if data_type in ("decimal", "numeric") else None,
        scale=(second or 0) if data_type in ("decimal", "numeric") else None,
        fsp=(first or 0) if data_type in ("datetime", "timestamp", "time") else None,
        char_length=first if data_type in ("char", "varchar", "binary", "varbinary") else None,
        charset=charset, collation=collation)


def probe_column(conn, database: str, definition: str, collation: str | None, where: str):
    """Let MySQL itself interpret ``definition`` (a column definition as in the DDL) in a
    temporary table (never binlogged, invisible to other sessions): returns the column as
    information_schema would describe it and the value an existing row takes when the column is
    added (``NOT_CONSTANT`` when two rows inserted at different times differ: a per-row,
    time-dependent or random default — or the definition reads other columns)."""
    from airflow_sync_provider.core.source.reader import arrow_schema, to_batch

    probe = mysql_table(database, _PROBE)
    with conn.cursor() as cur:
        cur.execute(f"DROP TEMPORARY TABLE IF EXISTS {probe}")
        try:
            cur.execute(f"CREATE TEMPORARY TABLE {probe} ({definition})"
                        + (f" DEFAULT COLLATE={collation}" if collation else ""))
        except Exception as exc:  # pymysql errors: a reference to another column, no privilege …
            code = exc.args[0] if exc.args else None
            if code in (1054, 3102, 3106, 1901, 1906):  # unknown column / generated column errors
                return None, NOT_CONSTANT
            raise ProbeFailed(f"{where}: MySQL could not evaluate the column definition {definition!r} in a "
                              f"temporary table ({exc}); grant CREATE TEMPORARY TABLES on {database} to the "
                              "pipeline's user") from exc
        try:
            cur.execute(f"SHOW FULL COLUMNS FROM {probe}")
            field, type_, collation_, null = cur.fetchone()[:4]
            column = _column_from_show(conn, field, type_, collation_, null)
            if "GENERATED" in definition.upper() or re.search(r"\bAS\s*\(", definition, re.IGNORECASE):
                return column, NOT_CONSTANT
            mapping = map_column(column, where)
            cur.execute("SET @airflow_sync_mode = @@SESSION.sql_mode, SESSION sql_mode = ''")
            try:  # two rows at different times: equal means one constant for every existing row
                for stamp in (1_000_000_000.25, 1_500_000_000.5):
                    cur.execute(f"SET TIMESTAMP = {stamp}")
                    cur.execute(f"INSERT INTO {probe} () VALUES ()")
            finally:
                cur.execute("SET TIMESTAMP = DEFAULT, SESSION sql_mode = @airflow_sync_mode")
            cur.execute(f"SELECT {mapping.source_sql(mysql_ident(field))} FROM {probe}")
            rows = cur.fetchall()
        finally:
            cur.execute(f"DROP TEMPORARY TABLE IF EXISTS {probe}")
    values = to_batch(rows, [mapping], arrow_schema([mapping]), where).column(0).to_pylist()
    return column, values[0] if values[0] == values[1] else NOT_CONSTANT


# --- how a changed column relates to the old one ---------------------------------------------

_INT = re.compile(r"^(U?)Int(\d+)$")
_DEC = re.compile(r"^Decimal\((\d+), (\d+)\)$")
_DT = re.compile(r"^DateTime64\((\d), 'UTC'\)$")
_SUPERSETS = {"ascii": {"latin1", "utf8mb3", "utf8", "utf8mb4"}, "utf8mb3": {"utf8mb4"}, "utf8": {"utf8mb4"}}


def widens(old: str, new: str) -> bool:
    """Can every value of ClickHouse type ``old`` be stored unchanged in ``new``?"""
    if old == new:
        return True
    if new.startswith("Nullable("):
        return widens(old[9:-1] if old.startswith("Nullable(") else old, new[9:-1])
    if old.startswith("Nullable("):
        return False  # NULL to NOT NULL: NULLs would have nowhere to go
    (a, b), (c, d) = ((_INT.match(old), _INT.match(new)), (_DEC.match(old), _DEC.match(new)))
    if a and b:  # signed never fits unsigned; unsigned fits a signed type twice as wide
        old_unsigned, new_unsigned, old_bits, new_bits = a.group(1), b.group(1), int(a.group(2)), int(b.group(2))
        if old_unsigned == new_unsigned:
            return new_bits >= old_bits
        return bool(old_unsigned) and new_bits > old_bits
    if c and d:  # no fewer integer digits, no fewer decimals
        (p, s), (q, t) = (int(c.group(1)), int(c.group(2))), (int(d.group(1)), int(d.group(2)))
        return t >= s and q - t >= p - s
    e, f = _DT.match(old), _DT.match(new)
    if e and f:
        return int(f.group(1)) >= int(e.group(1))
    return (old, new) == ("Float32", "Float64")


def _labels(column: MySQLColumn) -> set[str]:
    from airflow_sync_provider.core.typemap import set_labels

    return set(set_labels(column.column_type))


def keeps_values(old: MySQLColumn, new: MySQLColumn, table: str) -> bool:
    """Does MySQL keep every stored value of ``old`` unchanged when the column becomes ``new``,
    and does the copy's type hold them? (False: the values may change; re-copy.)"""
    a, b = map_column(old, table), map_column(new, table)
    if not widens(a.ch_type, b.ch_type) or type(a.rule) is not type(b.rule):
        return False
    if old.data_type in ("enum", "set") or new.data_type in ("enum", "set"):
        # stored as their labels' text; MySQL maps members by label, so only removed ones change
        return old.data_type == new.data_type and _labels(old) <= _labels(new)
    if old.collation or new.collation:  # strings: no shorter, and the same or a wider character set
        if (old.char_length or 0) > (new.char_length or 0) and new.data_type in ("char", "varchar"):
            return False
        if old.data_type == "char" != new.data_type or new.data_type == "char" != old.data_type:
            return False  # CHAR strips trailing spaces, VARCHAR keeps them
        return old.charset == new.charset or new.charset in _SUPERSETS.get(old.charset or "", ())
    if old.data_type in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return old.data_type == new.data_type and (new.char_length or 0) >= (old.char_length or 0)
    if old.data_type in ("float", "double") or new.data_type in ("float", "double"):
        return old.data_type == new.data_type or (old.data_type, new.data_type) == ("float", "double")
    return True


def ch_literal(value, ch_type: str) -> str:
    """``value`` (a target value, as the readers produce it) as a ClickHouse constant of ``ch_type``."""
    if value is None:
        return f"CAST(NULL AS {ch_type})"
    if isinstance(value, bool):
        text = str(int(value))
    elif isinstance(value, bytes):
        return f"CAST(unhex('{value.hex()}') AS {ch_type})"
    elif isinstance(value, float):
        text = "'" + repr(value) + "'"
    elif isinstance(value, (int, Decimal)):
        text = "'" + str(value) + "'"
    elif isinstance(value, dt.datetime):
        text = ch_string(value.isoformat(sep=" "))
    elif isinstance(value, (dt.date, str)):
        text = ch_string(str(value))
    else:
        raise TypeError(f"no ClickHouse literal for {type(value).__name__} {value!r}")
    return f"CAST({text} AS {ch_type})"
