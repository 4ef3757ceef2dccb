"""Rows events decoded straight into target rows: the binlog reader's per-row-change hot path.

python-mysql-replication (1.0.17) parses a rows event's row images lazily, value by value
through its packet wrapper's ``read_*`` calls, into a dict per image; ``TableRoute.row`` then
maps every value through its type rule's ``from_binlog``. About 50 µs a row change of a
10-column table, nearly all of the reader's time (issue 43). Here the images are read from the
event's bytes (:func:`row_bytes`) by code generated per table map and route
(:class:`TableDecoder`): the column types and their metadata are known from the table map
(``binlog_row_metadata=FULL``), so for each null-bitmap pattern one function reads the
fixed-width columns between two variable-width ones with one ``struct.unpack_from``, the
variable-width ones by their length prefixes, and writes each value straight in the target's
form — the very value ``TableRoute.row`` gives for the library's value, with the corrections of
core/cdc/binlog/ (tests/test_cdc_rowimage.py compares both on every mapped type, value by
value).

An update's before-image is decoded only as far as its key (the other columns are stepped over
by their lengths): it only tells whether the key changed. When it did, the whole before-image
is decoded for the old key's tombstone, which carries its values.

A table map this module cannot read (a column type it does not handle, e.g. MySQL's binary JSON
or the pre-5.6 temporal types; a row image without every column, written under
``binlog_row_image=MINIMAL``/``NOBLOB``) is decoded by the reference for that table, said once
in the log (:class:`Decoders`).
"""

from __future__ import annotations

import codecs
import logging
import struct

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent

from airflow_sync_provider.core import typemap
from airflow_sync_provider.core.cdc.binlog.routes import MOVED
from airflow_sync_provider.core.cdc.rowvalues import (
    date_or_none,
    datetime2_reader,
    decimal_reader,
    decimal_size,
    set_text_reader,
    time2_reader,
    time2_text_reader,
    timestamp2_reader,
)

log = logging.getLogger(__name__)

# null-bitmap patterns given code of their own per table; a table whose rows show more
# patterns (many nullable columns, NULLs at random) reads the rest with one general function
PATTERNS = 64



class Unsupported(Exception):
    """The table map has what the generated code does not read: the reference decodes it."""


_INTS = {FIELD_TYPE.TINY: "b", FIELD_TYPE.SHORT: "h", FIELD_TYPE.LONG: "i", FIELD_TYPE.LONGLONG: "q"}
_UINTS = {1: "B", 2: "H", 4: "I", 8: "Q"}
_STRINGS = (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING, FIELD_TYPE.BLOB)
# each rule's from_binlog as this module knows it: a rule changed since (a test's mutation) is called
_ORIGINAL = {cls: cls.from_binlog for cls in (typemap.Rule, typemap.IntRule, typemap.YearRule, typemap.BitRule,
                                               typemap.DecimalRule, typemap.FloatRule, typemap.DateRule,
                                               typemap.DateTimeRule, typemap.TimeRule, typemap.StringRule,
                                               typemap.BinaryRule, typemap.SpatialRule)}


class Column:
    """A table-map column as the generated code reads it: ``width`` fixed bytes that the struct
    format ``piece`` unpacks into ``parts`` values, or a little-endian length of ``prefix``
    bytes and that many bytes. ``value`` is the expression of the target value (TableRoute.row's
    for the library's value) of the parts ``{0}``, ``{1}`` or of the bytes ``{0}``; ``names``
    are the helpers it calls, for the generated code's namespace."""

    def __init__(self, index: int, column, mapping, helper: str, codec: str | None):
        self.index, self.name, self.target = index, column.name, None
        self.width, self.piece, self.parts, self.prefix = 0, "", 1, 0
        self.names: dict = {}
        cls = type(mapping.rule) if mapping is not None else None
        if cls is not None and _ORIGINAL.get(cls) is not cls.from_binlog:
            cls = None  # not a rule known here: its from_binlog is called
        library, fused = self._layout(column, mapping, cls, helper, codec)
        if mapping is None or cls is not None and cls.from_binlog is _ORIGINAL[typemap.Rule]:
            self.value = library  # from_binlog keeps the value
        elif fused is not None:
            self.value = fused
        else:  # TableRoute.row: the rule's from_binlog of every value but None
            self.names[f"{helper}c"], self.names[f"{helper}m"] = mapping.rule.from_binlog, mapping.source
            self.value = f"({helper}v if ({helper}v := {library}) is None else {helper}c({helper}v, {helper}m))"

    def _fixed(self, width: int, piece: str | None = None, parts: int = 1) -> None:
        self.width, self.piece, self.parts = width, piece or f"{width}s", parts

    def _layout(self, column, mapping, cls, helper: str, codec: str | None) -> tuple[str, str | None]:
        """(the library's value, the target value for rule ``cls`` when this module writes it
        without calling from_binlog, else None)."""
        kind = column.type
        if kind in _INTS:
            piece = _INTS[kind].upper() if column.unsigned else _INTS[kind]
            self._fixed(struct.calcsize(piece), piece)
            return "{0}", None
        if kind == FIELD_TYPE.INT24:  # a low byte, then the (signed) upper 16 bits
            self._fixed(3, "BH" if column.unsigned else "Bh", 2)
            return "({0} | {1} << 8)", None
        if kind in (FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE):
            self._fixed(4 if kind == FIELD_TYPE.FLOAT else 8, "f" if kind == FIELD_TYPE.FLOAT else "d")
            return "{0}", None
        if kind == FIELD_TYPE.YEAR:  # YEAR 0000 is stored as 0 and read as 1900; YearRule: 0
            self._fixed(1, "B")
            return "({0} + 1900)", "({0} + 1900 if {0} else 0)" if cls is typemap.YearRule else None
        if kind == FIELD_TYPE.DATE:
            self._fixed(3, "BH", 2)
            self.names[helper] = date_or_none
            return f"{helper}({{0}} | {{1}} << 8)", None
        if kind == FIELD_TYPE.DATETIME2:
            self._fixed(5 + (column.fsp + 1) // 2)
            self.names[helper] = datetime2_reader(column.fsp)
            value = f"{helper}(_from_bytes({{0}}, 'big'))"
            timestamp = mapping is not None and mapping.source.data_type == "timestamp"
            return value, value if cls is typemap.DateTimeRule and not timestamp else None
        if kind == FIELD_TYPE.TIMESTAMP2:
            self._fixed(4 + (column.fsp + 1) // 2)
            timestamp = cls is typemap.DateTimeRule and mapping.source.data_type == "timestamp"
            self.names[helper] = timestamp2_reader(column.fsp, False)
            self.names[f"{helper}z"] = timestamp2_reader(column.fsp, True)  # DateTimeRule: the epoch is NULL
            return (f"{helper}(_from_bytes({{0}}, 'big'))",
                    f"{helper}z(_from_bytes({{0}}, 'big'))" if timestamp else
                    f"{helper}(_from_bytes({{0}}, 'big'))" if cls is typemap.DateTimeRule else None)
        if kind == FIELD_TYPE.TIME2:
            self._fixed(3 + (column.fsp + 1) // 2)
            self.names[helper], self.names[f"{helper}t"] = time2_reader(column.fsp), time2_text_reader(column.fsp)
            return (f"{helper}(_from_bytes({{0}}, 'big'))",
                    f"{helper}t(_from_bytes({{0}}, 'big'))" if cls is typemap.TimeRule else None)
        if kind == FIELD_TYPE.NEWDECIMAL:
            self._fixed(decimal_size(column.precision, column.decimals))
            self.names[helper] = decimal_reader(column.precision, column.decimals)
            return f"{helper}({{0}})", None
        if kind == FIELD_TYPE.BIT:  # the library's string of the low ``bits`` bits; BitRule: their number
            self._fixed(column.bytes)
            number = f"(_from_bytes({{0}}, 'big') & {(1 << column.bits) - 1})"
            return f"format({number}, '0{column.bits}b')", number if cls is typemap.BitRule else None
        if kind in (FIELD_TYPE.ENUM, FIELD_TYPE.SET):
            self._fixed(column.size, _UINTS.get(column.size))
            number = "{0}" if column.size in _UINTS else "_from_bytes({0}, 'little')"
            if kind == FIELD_TYPE.ENUM:  # index 0 is the error value ''; without labels the library gives None
                self.names[helper] = tuple(column.enum_values or ())
                return (f"{helper}[{number}]" if column.enum_values else "None"), None
            # the library's set of labels; none (no bit, or no labels) is '' (TableRoute.row)
            labels = tuple(column.set_values or ())
            self.names[helper] = lambda mask: {label for i, label in enumerate(labels) if mask >> i & 1} or ""
            if cls is typemap.StringRule:
                self.names[f"{helper}t"] = set_text_reader(column.set_values, mapping.source)
            return f"{helper}({number})", f"{helper}t({number})" if cls is typemap.StringRule else None
        if kind in _STRINGS or kind in (FIELD_TYPE.GEOMETRY, FIELD_TYPE.JSON):
            self.prefix = column.length_size if kind not in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING) else \
                2 if column.max_length > 255 else 1
            if not 1 <= self.prefix <= 4:
                raise Unsupported(f"column {column.name!r}: a length prefix of {self.prefix} bytes")
            if kind not in _STRINGS:
                # a copied GEOMETRY is its bytes (SRID + WKB), as the library reads them; MySQL's JSON is binary
                if mapping is not None and not (kind == FIELD_TYPE.GEOMETRY and cls is typemap.SpatialRule):
                    raise Unsupported(f"column {column.name!r}: binlog type {_type_name(kind)}")
                return "{0}", None
            return self._string(mapping, cls, codec)
        raise Unsupported(f"column {column.name!r}: binlog type {_type_name(kind)}")

    @staticmethod
    def _string(mapping, cls, codec: str | None) -> tuple[str, str | None]:
        """A string column's bytes ``{0}`` decoded by the character set's codec; without a Python
        codec (e.g. binary) the library keeps the bytes, and b'' comes out as ''."""
        if codec is None:
            library = "({0} or '')"
            if cls is typemap.BinaryRule:  # the bytes, BINARY(n) padded with the zeros the binlog drops
                pad = mapping.source.char_length if mapping.source.data_type == "binary" else 0
                return library, "{0}" + (f".ljust({pad}, b'\\0')" if pad else "")
            return library, library if cls is typemap.StringRule else None
        library = f"{{0}}.decode({codec!r})" if ":" not in codec else \
            "{{0}}.decode({!r}, {!r})".format(*codec.split(":"))
        if cls is typemap.StringRule and mapping.source.data_type != "set":  # CHAR without its trailing spaces
            return library, library + (".rstrip(' ')" if mapping.source.data_type == "char" else "")
        return library, None


def _type_name(code: int) -> str:
    names = {v: k for k, v in vars(FIELD_TYPE).items() if k.isupper() and isinstance(v, int)}
    return f"{names.get(code, 'unknown')} ({code})"


# --- the generated code ---


class TableDecoder:
    """The row images of one table map (every column present) for one route. ``full(nulls)``
    gives the function of a null-bitmap pattern, ``(data, at) -> (row, key, end)``: the row as
    TableRoute.row makes it, its key as TableRoute.key_of, and where the image ends; ``key(nulls)``
    the same with only the key read (``row`` None). Made on first use, from :meth:`source`."""

    def __init__(self, columns: list, route, charset_to_encoding, errors: str = "strict"):
        by_name = {m.name: (i, m) for i, m in enumerate(route.mappings)}
        self.columns = []
        for index, column in enumerate(columns):
            target, mapping = by_name.get(column.name, (None, None))
            self.columns.append(Column(index, column, mapping, f"_c{index}",
                                       _codec(column, charset_to_encoding, errors)))
            self.columns[-1].target = target
        # the "key" an image function returns is the row's place (TableRoute.keyed): the key, then
        # the layout's columns, so an update that moves the row is seen from the images alone
        self.route, self.width, self.key_at = route, len(route.names), list(route.place_at)
        # a merged copy's member: its absent and source columns are constants of every row
        self.constants = {i: route.virtual[name] for i, name in enumerate(route.names) if name in route.virtual}
        missing = set(route.names) - {c.name for c in self.columns} - set(route.virtual)
        if missing:
            raise Unsupported(f"the table map lacks columns {sorted(missing)}")
        self.null_bytes = (len(columns) + 7) // 8
        self._full: dict = {}
        self._key: dict = {}
        self._probe: dict = {}

    def full(self, nulls: int):
        fn = self._full.get(nulls)
        if fn is None:
            fn = self._full[nulls] = self._compile(nulls if len(self._full) < PATTERNS else None, False)
        return fn

    def key(self, nulls: int):
        fn = self._key.get(nulls)
        if fn is None:
            fn = self._key[nulls] = self._compile(nulls if len(self._key) < PATTERNS else None, True)
        return fn

    def probe(self, nulls: int):
        """:meth:`key` whose "key" is the place and then the row filter's columns (an update's old
        image under a filter: TableRoute.settle)."""
        fn = self._probe.get(nulls)
        if fn is None:
            fn = self._probe[nulls] = self._compile(nulls if len(self._probe) < PATTERNS else None, True,
                                                    self.key_at + self.route.filter_at)
        return fn

    def _compile(self, nulls: int | None, key_only: bool, key_at: list | None = None):
        source, namespace = self.source(nulls, key_only, key_at)
        exec(compile(source, f"<row image of {self.route.source}>", "exec"), namespace)
        return namespace["image"]

    def source(self, nulls: int | None, key_only: bool, key_at: list | None = None) -> tuple[str, dict]:
        """The code of null-bitmap pattern ``nulls`` (None: the general code, which tests each
        column's bit) and the names it uses; ``key_at``: the columns of the "key" it returns
        (default: the place)."""
        key_at = self.key_at if key_at is None else key_at
        namespace = {"_from_bytes": int.from_bytes, **{f"_k{i}": v for i, v in self.constants.items()}}
        for c in self.columns:
            namespace.update(c.names)
        wanted = {c.target for c in self.columns if c.target is not None
                  and (not key_only or c.target in key_at)}
        lines, run = ["def image(data, at):"], []
        if nulls is None:
            lines.append(f"    nulls = _from_bytes(data[at - {self.null_bytes}:at], 'little')")
        for c in self.columns:
            if nulls is None:  # each column on its own, behind its bit
                lines.append(f"    if nulls >> {c.index} & 1:")
                lines.append(f"        v{c.target} = None" if c.target is not None else "        pass")
                lines.append("    else:")
                read = self._prefixed(c, wanted) if c.prefix else self._fixed(namespace, [c], wanted)
                lines += ["    " + line for line in read]
            elif nulls >> c.index & 1:
                if c.target is not None:
                    lines.append(f"    v{c.target} = None")
            elif c.prefix:
                lines += self._fixed(namespace, run, wanted) + self._prefixed(c, wanted)
                run = []
            else:
                run.append(c)
        lines += self._fixed(namespace, run, wanted)
        if not key_only:
            lines += [f"    v{i} = _k{i}" for i in self.constants]
        key = "(" + "".join(f"v{i}, " for i in key_at) + ")"
        row = "None" if key_only else "(" + "".join(f"v{i}, " for i in range(self.width)) + ")"
        lines.append(f"    return {row}, {key}, at")
        return "\n".join(lines) + "\n", namespace

    @staticmethod
    def _fixed(namespace: dict, run: list[Column], wanted: set) -> list[str]:
        """Lines reading the fixed-width columns ``run`` with one unpack_from, moving ``at`` past them."""
        if not run:
            return []
        lines, parts = [], []
        for c in run:
            names = [f"a{len(parts) + k}" for k in range(c.parts)]
            parts += names
            if c.target in wanted:
                lines.append(f"    v{c.target} = {c.value.format(*names)}  # {c.name}")
        if lines:
            name = f"_s{len(namespace)}"
            namespace[name] = struct.Struct("<" + "".join(c.piece for c in run))
            lines.insert(0, f"    {', '.join(parts)}, = {name}.unpack_from(data, at)")
        return lines + [f"    at += {sum(c.width for c in run)}"]

    @staticmethod
    def _prefixed(c: Column, wanted: set) -> list[str]:
        """Lines reading a column of ``c.prefix`` bytes of length, then its bytes."""
        length = {1: "data[at]", 2: "data[at] | data[at + 1] << 8"}.get(
            c.prefix, f"_from_bytes(data[at:at + {c.prefix}], 'little')")
        lines = [f"    n = {length}"]
        if c.target in wanted:
            value = c.value.format(f"data[at + {c.prefix}:at + {c.prefix} + n]")
            lines.append(f"    v{c.target} = {value}  # {c.name}")
        return lines + [f"    at += {c.prefix} + n"]


def _codec(column, charset_to_encoding, errors: str) -> str | None:
    """The codec the library decodes a string column with, ``encoding[:errors]`` (None: it keeps
    the bytes)."""
    if column.type not in _STRINGS:
        return None
    encoding = "utf-8" if column.character_set_name is None else charset_to_encoding(column.character_set_name)
    try:
        codecs.lookup(encoding)
    except LookupError:
        return None
    return encoding if errors == "strict" else f"{encoding}:{errors}"


# --- events ---


def row_bytes(event) -> tuple[bytes, int, int]:
    """A plain (not compressed) rows event's row images: the packet's bytes, where they start
    (right after the columns-present bitmaps, which the library has read) and end (before the
    checksum)."""
    wrapper = event.packet
    packet = wrapper.packet
    start = packet._position
    return packet._data, start, start + event.event_size - wrapper.read_bytes


class Decoders:
    """A reader's decoders, one per table id (a table map), made anew when the table map or the
    route changes; None where the reference decodes (the table, or an event without every
    column)."""

    def __init__(self, ring):
        self.ring = ring
        self._built: dict = {}  # table id → (table map columns, route, every column's bit, decoder)
        self._said: set = set()
        self._lanes: dict = {}  # (table, key width, moves) → its lane function

    def get(self, event, route) -> TableDecoder | None:
        if getattr(event, "compressed", False):  # its rows were parsed by the gate (binlog.EventGate)
            return None
        built = self._built.get(event.table_id)
        if built is None or built[0] is not event.columns or built[1] is not route:
            decoder = None
            try:
                if event.number_of_columns != len(event.columns):
                    raise Unsupported(f"the rows event has {event.number_of_columns} columns, its table map "
                                      f"{len(event.columns)}")
                decoder = TableDecoder(event.columns, route, event.charset_to_encoding,
                                       "ignore" if event._ignore_decode_errors else "strict")
            except Unsupported as exc:
                self._say(route, str(exc))
            built = self._built[event.table_id] = (event.columns, route, (1 << len(event.columns)) - 1, decoder)
        decoder, everything = built[3], built[2]
        if decoder is not None and not all(int.from_bytes(bitmap, "little") & everything == everything for bitmap in
                                           (event.columns_present_bitmap,
                                            getattr(event, "columns_present_bitmap2", event.columns_present_bitmap))):
            self._say(route, "row images without every column (binlog_row_image is not FULL)")
            return None
        if decoder is not None and event.packet._BinLogPacketWrapper__data_buffer:
            self._say(route, "bytes the library pushed back: the images do not start where its packet is")
            return None
        return decoder

    def _say(self, route, why: str) -> None:
        if (route.source, why) not in self._said:
            self._said.add((route.source, why))
            log.info("table %s: %s: its row images are decoded by python-mysql-replication (slower)",
                     route.source, why)

    def lane_of(self, route):
        """The lane function of a row's place (TableRoute.place_of): by its key alone, so every
        change of a key goes to one lane."""
        cached = (route.source, len(route.key_at), route.moves)
        lane = self._lanes.get(cached)
        if lane is None:
            lane = self.ring.router(route.source)
            if route.moves:
                by_key, width = lane, len(route.key_at)
                lane = lambda place: by_key(place[:width])  # noqa: E731
            lane = self._lanes[cached] = lane
        return lane

    def changes(self, decoder: TableDecoder, event, version: int, out: list) -> None:
        """Append the event's row changes to ``out`` as the reader's items
        (route, lane, row, version, deleted): rows ranked ``version`` + their index."""
        data, at, end = row_bytes(event)
        route, lane, nb, full = decoder.route, self.lane_of(decoder.route), decoder.null_bytes, decoder.full
        append = out.append
        if isinstance(event, UpdateRowsEvent) and route.multiset:
            # a row without a key: its old occurrence goes (-1), its new one comes (+1), each as the
            # filter (if any) holds it; an update that changed nothing changes nothing
            wanted = route.wanted if route.row_filter is not None else None
            while at < end:
                nulls = data[at] if nb == 1 else int.from_bytes(data[at:at + nb], "little")
                before, _, after = full(nulls)(data, at + nb)
                nulls_after = data[after] if nb == 1 else int.from_bytes(data[after:after + nb], "little")
                row, key, end_at = full(nulls_after)(data, after + nb)
                if before != row:
                    if wanted is None or wanted(before):  # MOVED: part of the update, not a change of its own
                        append((route, lane(key), before, version, MOVED if wanted is None or wanted(row) else True))
                    if wanted is None or wanted(row):
                        append((route, lane(key), row, version, False))
                at, version = end_at, version + 1
            return
        if isinstance(event, UpdateRowsEvent) and route.row_filter is not None:
            # both images decide (TableRoute.settle): the old one read as far as its place and the
            # filter's columns, and whole only for the tombstone of a row that leaves or moves
            probe, places = decoder.probe, len(route.place_at)
            while at < end:
                nulls = data[at] if nb == 1 else int.from_bytes(data[at:at + nb], "little")
                _, old, after = probe(nulls)(data, at + nb)
                nulls_after = data[after] if nb == 1 else int.from_bytes(data[after:after + nb], "little")
                row, _, end_at = full(nulls_after)(data, after + nb)
                # the whole old image, read only for a tombstone; called before ``at`` moves on
                whole = lambda: full(nulls)(data, at + nb)[0]  # noqa: E731, B023
                for image, flag in route.settle(route.decided(old[places:]), row, whole, old[:places]):
                    append((route, lane(route.place_of(image)), image, version, flag))
                at, version = end_at, version + 1
            return
        if isinstance(event, UpdateRowsEvent):
            keys, width = decoder.key, len(route.key_at)
            while at < end:
                nulls = data[at] if nb == 1 else int.from_bytes(data[at:at + nb], "little")
                _, old, after = keys(nulls)(data, at + nb)
                nulls_after = data[after] if nb == 1 else int.from_bytes(data[after:after + nb], "little")
                row, key, end_at = full(nulls_after)(data, after + nb)
                if old != key:  # the row moved (key or layout): its old place gets a tombstone of the old values
                    moved = old[:width] == key[:width]  # within its key: a layout's place (routes.MOVED)
                    append((route, lane(old), full(nulls)(data, at + nb)[0], version, MOVED if moved else True))
                append((route, lane(key), row, version, False))
                at, version = end_at, version + 1
            return
        deleted = route.delete_flag(event.timestamp) if isinstance(event, DeleteRowsEvent) else False
        wanted = route.wanted if route.row_filter is not None else None
        while at < end:
            nulls = data[at] if nb == 1 else int.from_bytes(data[at:at + nb], "little")
            row, key, at = full(nulls)(data, at + nb)
            if wanted is None or wanted(row):  # a row the filter leaves out was never in the copy
                append((route, lane(key), row, version, deleted))
            version += 1
