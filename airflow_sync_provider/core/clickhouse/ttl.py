"""A copy's TTL, and the rows its checks compare (docs/layouts.md#ttl).

ClickHouse deletes a TTL'd copy's expired rows at merges, whenever those run, while the source
keeps them: a check that compared every row would call them missing. So the checks (reconcile,
the snapshot diff, the rolling verification) compare a **window**: the rows whose TTL falls more
than a margin (:meth:`Expiry.margin`) after the check began, which no merge can have deleted, chosen on both sides
by one literal (:meth:`Window.mysql_sql`, :meth:`Window.ch_sql`). The rows nearer their expiry
are not compared; the log says how far back the window reaches.

That needs a deleting TTL clause ClickHouse and this module read alike: ``COLUMN + INTERVAL n
UNIT`` (or ``toInterval<Unit>(n)``), ``COLUMN`` a DATE, DATETIME or TIMESTAMP column (wrapped in
``assumeNotNull(…)`` when it may be NULL: ClickHouse refuses a Nullable TTL), optionally followed by
``DELETE``. Clauses that keep their rows (``TO DISK``, ``TO VOLUME``, ``RECOMPRESS``) may read
anything; one that deletes by another expression, ``WHERE`` or ``GROUP BY`` is refused by name.
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime as dt
import re
from dataclasses import dataclass

from airflow_sync_provider.core.source.planning import Filter, Plan
from airflow_sync_provider.core.sql import ch_ident, ch_string, mysql_ident

# beyond a check's start: more than the ClickHouse server's zone (±14 h: a DATE's TTL expires at its
# midnight there) and a long check's run; month, quarter and year arithmetic clamps a 31st by up to
# 3 days (+ 1 MONTH of Jan 31 is Feb 28), which their margin adds
MARGIN = dt.timedelta(days=1)
CLAMPING = dt.timedelta(days=3)
_UNITS = ("SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "QUARTER", "YEAR")
_KEEPS = re.compile(r"\s(TO\s+(DISK|VOLUME)\s+'(?:[^'\\]|\\.)*'|RECOMPRESS\s+CODEC\s*\(.*\))\s*$", re.I | re.S)
_COLUMN = r"(?:`((?:[^`\\]|\\.)+)`|([A-Za-z_][A-Za-z0-9_]*))"
_DELETES = re.compile(
    rf"\s*(?:assumeNotNull\s*\(\s*{_COLUMN}\s*\)|{_COLUMN})\s*\+\s*"
    rf"(?:INTERVAL\s+(\d+)\s+([A-Za-z]+)|toInterval([A-Za-z]+)\s*\(\s*(\d+)\s*\))\s*(?:DELETE\s*)?", re.I)
_DATE_TYPES = ("date", "datetime", "timestamp")


class TtlError(ValueError):
    retry_helps = False  # the message names the clause to change


@dataclass(frozen=True)
class Expiry:
    """A deleting clause: a row expires ``amount`` ``unit``s after its ``column``."""

    column: str
    amount: int
    unit: str

    @property
    def margin(self) -> dt.timedelta:
        return MARGIN + (CLAMPING if self.unit in ("MONTH", "QUARTER", "YEAR") else dt.timedelta(0))

    def before(self, moment: dt.datetime) -> dt.datetime:
        """``moment`` minus the interval (months clamped to their last day, as both databases do)."""
        months = {"MONTH": 1, "QUARTER": 3, "YEAR": 12}.get(self.unit)
        if months is None:
            seconds = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400, "WEEK": 604800}[self.unit]
            return moment - dt.timedelta(seconds=self.amount * seconds)
        index = moment.year * 12 + moment.month - 1 - self.amount * months
        year, month = divmod(index, 12)
        day = min(moment.day, calendar.monthrange(year, month + 1)[1])
        return moment.replace(year=year, month=month + 1, day=day)


def _clauses(ttl: str) -> list[str]:
    """The TTL's clauses: split at the commas outside parentheses and quotes."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(ttl):
        if quote:
            quote = "" if ch == quote and ttl[i - 1] != "\\" else quote
        elif ch in "'`\"":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(ttl[start:i])
            start = i + 1
    return [c.strip() for c in [*out, ttl[start:]] if c.strip()]


def expiries(ttl: str, table: str) -> tuple[Expiry, ...]:
    """The TTL's deleting clauses; refuses, naming the clause, what the checks could not window."""
    found = []
    for clause in _clauses(ttl or ""):
        if _KEEPS.search(clause):
            continue  # moves or recompresses its rows: they stay
        match = _DELETES.fullmatch(clause)
        unit = ((match.group(6) or match.group(7)) or "").upper() if match else ""
        if not match or unit not in _UNITS:
            raise TtlError(
                f"table {table}: TTL clause {clause!r}: a TTL that deletes rows must read COLUMN + INTERVAL n UNIT "
                "(COLUMN a date or time column, assumeNotNull(COLUMN) if it may be NULL; UNIT one of "
                f"{', '.join(_UNITS)}), so that the checks can leave out the rows it may have deleted and still "
                "compare the others exactly; a TTL with WHERE, GROUP BY or another expression is not supported "
                "(TO DISK / TO VOLUME / RECOMPRESS clauses may read anything)")
        column = next(g for g in match.groups()[:4] if g is not None).replace("\\", "")
        found.append(Expiry(column, int(match.group(5) or match.group(8)), unit))
    return tuple(found)


def check_columns(found: tuple[Expiry, ...], mappings, table: str) -> None:
    """Each expiry's column is a date or time column the copy holds as it is."""
    by_name = {m.name: m for m in mappings}
    for expiry in found:
        mapping = by_name.get(expiry.column)
        if mapping is None:
            raise TtlError(f"table {table}: TTL column {expiry.column!r} is not a column of the copy")
        if mapping.source.data_type not in _DATE_TYPES or mapping.transform is not None:
            raise TtlError(f"table {table}: TTL column {expiry.column!r} is {mapping.source.data_type}"
                           + (" with a transform" if mapping.transform is not None else "")
                           + "; a TTL that deletes rows reads a DATE, DATETIME or TIMESTAMP column as copied")


@dataclass(frozen=True)
class Window:
    """The rows a TTL'd copy's checks compare: each expiry's column after its ``since``."""

    bounds: tuple[tuple[str, str, str], ...] = ()  # (column, MySQL data type, literal text)

    @classmethod
    def of(cls, ttl: str, mappings, table: str, now: dt.datetime | None = None) -> "Window":
        found = expiries(ttl, table)
        check_columns(found, mappings, table)
        types = {m.name: m.source.data_type for m in mappings}
        now = now or dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        bounds = []
        for expiry in found:
            since = expiry.before(now + expiry.margin).replace(microsecond=0)
            text = since.date().isoformat() if types[expiry.column] == "date" else since.isoformat(" ")
            bounds.append((expiry.column, types[expiry.column], text))
        return cls(tuple(bounds))

    def __bool__(self) -> bool:
        return bool(self.bounds)

    def mysql_sql(self, mappings) -> tuple[str, tuple]:
        """The window in MySQL, over the value the copy holds (zero and invalid dates: NULL, out)."""
        by_name = {m.name: m for m in mappings}
        parts = [f"{by_name[c].source_sql(mysql_ident(c))} > %s" for c, _, _ in self.bounds]
        return " AND ".join(parts) or "1=1", tuple(text for _, _, text in self.bounds)

    def narrowed(self, plan: Plan, mappings) -> Plan:
        """``plan`` with the window and-ed to every shard's source predicate."""
        if not self:
            return plan
        window = Filter(*self.mysql_sql(mappings))
        return dataclasses.replace(plan, shards=tuple(window.apply(s) for s in plan.shards))

    def ch_sql(self) -> str:
        """The window in ClickHouse, with the same literals."""
        parts = [f"{ch_ident(c)} > " + (f"toDate32({ch_string(text)})" if kind == "date"
                                         else f"toDateTime64({ch_string(text)}, 0, 'UTC')")
                 for c, kind, text in self.bounds]
        return " AND ".join(parts) or "1"

    def describe(self) -> str:
        """The window, and a warning when it holds no row that exists yet (a TTL within its margin)."""
        text = ", ".join(f"{c} > {text}" for c, _, text in self.bounds)
        now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
        if any(dt.datetime.fromisoformat(since) > now for _, _, since in self.bounds):
            text += (" (in the future: the TTL is shorter than the check's margin, so only rows dated ahead are "
                     "compared)")
        return text
