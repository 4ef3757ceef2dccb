"""The values the generated row-image code (core/cdc/rowimage.py) calls: each reads a column's
packed bytes exactly as python-mysql-replication does, then through the type rule's
``from_binlog`` (tests/test_cdc_rowimage.py compares both on every mapped type, value by value)."""

from __future__ import annotations

import datetime as dt
import functools
from decimal import Decimal

from airflow_sync_provider.core import typemap

_EPOCH = dt.datetime(1970, 1, 1)
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)  # bytes of a DECIMAL group of 0…9 digits (decimal.cc)


def date_or_none(packed: int):
    """DATE as core/cdc/binlog/ reads it: zero and invalid dates are NULL."""
    year, month, day = packed >> 9, (packed >> 5) & 0xF, packed & 0x1F
    try:
        return dt.date(year, month, day) if year and month and day else None
    except ValueError:
        return None


def fraction_reader(fsp: int):
    """The fraction of a DATETIME2 / TIMESTAMP2(fsp) packed behind its seconds: (microseconds,
    what is before it). The library reads it as a signed number (a negative one then counts as
    no fraction) and drops an odd fsp's last digit."""
    size = (fsp + 1) // 2
    bits, half = 8 * size, 1 << max(0, 8 * size - 1)
    scale = 10 ** (6 - fsp)

    def fraction(packed: int) -> tuple[int, int]:
        if not size:
            return 0, packed
        micro, packed = packed & ((1 << bits) - 1), packed >> bits
        if micro >= half:
            micro -= 1 << bits
        return (int(micro / 10) if fsp % 2 else micro) * scale, packed

    return fraction


def datetime2_reader(fsp: int):
    """DATETIME2(fsp) from its big-endian bytes as one integer: the library's value (zero and
    invalid values None; a fraction only when positive, as its ``__add_fsp_to_time``)."""
    fraction = fraction_reader(fsp)

    def read(packed: int):
        micro, packed = fraction(packed)
        ym = packed >> 22 & 0x1FFFF
        try:
            return dt.datetime(ym // 13, ym % 13, packed >> 17 & 31, packed >> 12 & 31, packed >> 6 & 63,
                               packed & 63, micro if micro > 0 else 0)
        except ValueError:
            return None

    return read


def timestamp2_reader(fsp: int, zero_is_null: bool):
    """TIMESTAMP2(fsp): seconds since the epoch (big-endian, signed as the library reads them)
    and the fraction; a zero TIMESTAMP (the epoch) is NULL for a TIMESTAMP column (DateTimeRule)."""
    fraction = fraction_reader(fsp)

    def read(packed: int):
        micro, packed = fraction(packed)
        if packed >= 1 << 31:
            packed -= 1 << 32
        value = dt.datetime.utcfromtimestamp(packed)
        if micro > 0:
            value = value.replace(microsecond=micro)
        return None if zero_is_null and value == _EPOCH else value

    return read


def _time2_parts(fsp: int):
    """TIME2(fsp) as MySQL packs it (my_time_packed_from_binary), the way core/cdc/binlog/ reads
    it (negative times with a fraction included): (sign, hours, minutes, seconds, microseconds)."""
    size = (fsp + 1) // 2

    def parts(packed: int) -> tuple:
        if size == 3:
            packed -= 0x800000000000
        else:
            intpart, frac = (packed >> (8 * size)) - 0x800000, packed & ((1 << (8 * size)) - 1)
            if intpart < 0 and frac:
                intpart, frac = intpart + 1, frac - (1 << (8 * size))
            packed = (intpart << 24) + frac * (10_000 if size == 1 else 100)
        sign, packed = (-1 if packed < 0 else 1), abs(packed)
        hms = packed >> 24
        return sign, (hms >> 12) % 1024, (hms >> 6) % 64, hms % 64, packed % (1 << 24)

    return parts


def time2_reader(fsp: int):
    """TIME2(fsp) as the timedelta core/cdc/binlog/'s reader gives."""
    parts = _time2_parts(fsp)

    def read(packed: int) -> dt.timedelta:
        sign, hours, minutes, seconds, micros = parts(packed)
        return sign * dt.timedelta(hours=hours, minutes=minutes, seconds=seconds, microseconds=micros)

    return read


def time2_text_reader(fsp: int):
    """TIME2(fsp) straight as TimeRule's text ``[-]HH:MM:SS[.ffffff]`` of that timedelta."""
    parts = _time2_parts(fsp)

    def read(packed: int) -> str:
        sign, hours, minutes, seconds, micros = parts(packed)
        micros += ((hours * 60 + minutes) * 60 + seconds) * 1_000_000
        hours, rest = divmod(micros, 3_600_000_000)
        minutes, rest = divmod(rest, 60_000_000)
        seconds, fraction = divmod(rest, 1_000_000)
        return (f"{'-' if sign < 0 and micros else ''}{hours:02d}:{minutes:02d}:{seconds:02d}"
                + (f".{fraction:06d}" if fraction else ""))

    return read


def decimal_size(precision: int, scale: int) -> int:
    intg = precision - scale
    return intg // 9 * 4 + _DIG2BYTES[intg % 9] + scale // 9 * 4 + _DIG2BYTES[scale % 9]


@functools.lru_cache(maxsize=None)
def decimal_reader(precision: int, scale: int):
    """DECIMAL(precision, scale) from its bytes (MySQL's decimal2bin: groups of 9 digits in 4
    big-endian bytes, the leading and trailing partial groups in fewer, the sign bit flipped,
    every bit inverted when negative) as the library's Decimal: the same digits and exponent.
    Its code is generated per precision and scale: the groups' arithmetic written out."""
    size = decimal_size(precision, scale)
    top, everything = 1 << (8 * size - 1), (1 << (8 * size)) - 1
    intg = precision - scale
    # (bytes, digits) of each group, least significant first
    groups = ([(_DIG2BYTES[scale % 9], scale % 9)] + [(4, 9)] * (scale // 9) + [(4, 9)] * (intg // 9)
              + [(_DIG2BYTES[intg % 9], intg % 9)])
    terms, shift, weight = [], 0, 1
    for size_, digits in groups:
        if size_:
            terms.append(f"(packed >> {shift} & {(1 << (8 * size_)) - 1}) * {weight}")
            shift, weight = shift + 8 * size_, weight * 10 ** digits
    number = " + ".join(terms) or "0"
    exponent = f"E-{scale}" if scale else ""
    source = (f"def read(raw):\n"
              f"    packed = _from_bytes(raw, 'big') ^ {top}\n"
              f"    if packed & {top}:\n"
              f"        packed ^= {everything}\n"
              f"        return _Decimal(f'-{{{number}}}{exponent}')\n"
              f"    return " + (f"_Decimal(f'{{{number}}}{exponent}')\n" if scale else f"_Decimal({number})\n"))
    namespace = {"_from_bytes": int.from_bytes, "_Decimal": Decimal}
    exec(compile(source, f"<DECIMAL({precision}, {scale})>", "exec"), namespace)
    return namespace["read"]


def set_text_reader(table_labels: list | None, column: typemap.MySQLColumn):
    """SET as StringRule writes it: the labels in the column's definition order, '' for none."""
    order = typemap.set_labels(column.column_type)
    labels = list(table_labels or [])

    def read(mask: int) -> str:
        present = {label for i, label in enumerate(labels) if mask >> i & 1}
        return ",".join(label for label in order if label in present) if present else ""

    return read


# --- one column: how the generated code reads it ---
