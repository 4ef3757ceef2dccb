"""MySQL's internal geometry values for tests, built and read here independently of the code under
test: the SRID (4 bytes, little-endian) then the WKB (little-endian, 2-D), as ``SELECT col``
returns them. :func:`geometry` builds one from a kind and coordinates, :func:`parse` reads one
back into (SRID, kind, coordinates) and :func:`parse_wkt` reads MySQL's ``ST_AsText`` into the
same coordinates. Hypothesis strategies draw values of each kind, edge values included (empty
collections, -0.0, the largest and smallest doubles)."""

from __future__ import annotations

import re
import struct

from hypothesis import strategies as st

KINDS = {1: "point", 2: "linestring", 3: "polygon", 4: "multipoint", 5: "multilinestring", 6: "multipolygon",
         7: "geometrycollection"}
CODES = {kind: code for code, kind in KINDS.items()}
_PART = {"multipoint": "point", "multilinestring": "linestring", "multipolygon": "polygon"}


def wkb(kind: str, coords) -> bytes:
    """The WKB of ``kind`` with ``coords``: a point (x, y); a linestring [points]; a polygon
    [rings]; a multi-kind [parts]; a collection [(kind, coords)]."""
    head = struct.pack("<BI", 1, CODES[kind])
    if kind == "point":
        return head + struct.pack("<dd", *coords)
    if kind == "linestring":
        return head + struct.pack("<I", len(coords)) + b"".join(struct.pack("<dd", *p) for p in coords)
    if kind == "polygon":
        return head + struct.pack("<I", len(coords)) + b"".join(
            struct.pack("<I", len(ring)) + b"".join(struct.pack("<dd", *p) for p in ring) for ring in coords)
    if kind in _PART:
        return head + struct.pack("<I", len(coords)) + b"".join(wkb(_PART[kind], part) for part in coords)
    return head + struct.pack("<I", len(coords)) + b"".join(wkb(k, c) for k, c in coords)


def geometry(kind: str, coords, srid: int = 0) -> bytes:
    """MySQL's internal value: the SRID, then the WKB."""
    return struct.pack("<I", srid) + wkb(kind, coords)


def _read(data: bytes, at: int):
    order, code = struct.unpack_from("<BI", data, at)
    assert order == 1, "MySQL's internal WKB is little-endian"
    kind, at = KINDS[code], at + 5
    if kind == "point":
        return kind, struct.unpack_from("<dd", data, at), at + 16
    (count,), at = struct.unpack_from("<I", data, at), at + 4
    if kind == "linestring":
        return kind, [struct.unpack_from("<dd", data, at + 16 * i) for i in range(count)], at + 16 * count
    if kind == "polygon":
        rings = []
        for _ in range(count):
            (points,), at = struct.unpack_from("<I", data, at), at + 4
            rings.append([struct.unpack_from("<dd", data, at + 16 * i) for i in range(points)])
            at += 16 * points
        return kind, rings, at
    parts = []
    for _ in range(count):
        part_kind, coords, at = _read(data, at)
        parts.append(coords if kind in _PART else (part_kind, coords))
    return kind, parts, at


def parse(value: bytes) -> tuple[int, str, object]:
    """(SRID, kind, coordinates) of an internal value; every byte must be read."""
    (srid,) = struct.unpack_from("<I", value, 0)
    kind, coords, end = _read(value, 4)
    assert end == len(value), f"{len(value) - end} bytes after the geometry"
    return srid, kind, coords


def plain(coords):
    """Coordinates as nested lists of (x, y) tuples (ClickHouse gives tuples and lists)."""
    if isinstance(coords, tuple):
        return tuple(float(c) for c in coords)
    return [plain(c) for c in coords]


def parse_wkt(text: str):
    """The coordinates of MySQL's ``ST_AsText`` of a point, linestring, polygon or multi-kind, as
    :func:`parse` gives them (MariaDB writes the shortest digits that read back as the double)."""
    tokens, at = re.findall(r"\(|\)|,|[^\s(),]+", text), 1

    def group():
        nonlocal at
        assert tokens[at] == "(", text
        at, items = at + 1, []
        while tokens[at] != ")":
            if tokens[at] == "(":
                items.append(group())
            else:  # a point: two numbers
                items.append((float(tokens[at]), float(tokens[at + 1])))
                at += 2
            at += tokens[at] == ","
        at += 1
        return items

    kind, coords = tokens[0].lower(), group()
    if kind == "point":
        return coords[0]
    if kind == "multipoint":  # MySQL 8 writes MULTIPOINT((1 2),(3 4)), MariaDB MULTIPOINT(1 2,3 4)
        return [p[0] if isinstance(p, list) else p for p in coords]
    return coords


# --- hypothesis strategies -------------------------------------------------------------------

EDGE_DOUBLES = [0.0, -0.0, 1.7976931348623157e308, -1.7976931348623157e308, 5e-324, 2.2250738585072014e-308,
                0.1, 123456789.123456789]
_doubles = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(EDGE_DOUBLES)
_points = st.tuples(_doubles, _doubles)
_rings = st.lists(_points, min_size=3, max_size=5).map(lambda ring: [*ring, ring[0]])  # closed, as MySQL 8 wants
_coords = {
    "point": _points,
    "linestring": st.lists(_points, min_size=2, max_size=5),
    "polygon": st.lists(_rings, min_size=1, max_size=3),
    "multipoint": st.lists(_points, min_size=1, max_size=4),
    "multilinestring": st.lists(st.lists(_points, min_size=2, max_size=4), min_size=1, max_size=3),
    "multipolygon": st.lists(st.lists(_rings, min_size=1, max_size=2), min_size=1, max_size=3),
}
_coords["geometrycollection"] = st.lists(
    st.sampled_from(sorted(_coords)).flatmap(lambda k: _coords[k].map(lambda c: (k, c))), max_size=3)
SRIDS = st.sampled_from([0, 4326])


def values(kind: str):
    """Internal values for a column of ``kind`` (a GEOMETRY column takes every kind)."""
    kinds = sorted(_coords) if kind == "geometry" else [kind]
    return st.sampled_from(kinds).flatmap(lambda k: st.tuples(SRIDS, _coords[k]).map(lambda v: geometry(k, v[1],
                                                                                                        v[0])))


def edge_values(kind: str) -> list[bytes]:
    """Each kind's edge values: both SRIDs, extreme doubles, -0.0, empty collections (which MariaDB
    stores: GEOMETRYCOLLECTION EMPTY, an empty MULTIPOINT or MULTIPOLYGON written as WKB)."""
    big, tiny = 1.7976931348623157e308, 5e-324
    by_kind = {
        "point": [geometry("point", (1.5, -2.25)), geometry("point", (-0.0, tiny), 4326),
                  geometry("point", (big, -big), 4326)],
        "linestring": [geometry("linestring", [(0, 0), (1, 1), (2, 3)], 4326),
                       geometry("linestring", [(-0.0, 0.1), (big, tiny)])],
        "polygon": [geometry("polygon", [[(0, 0), (10, 0), (10, 10), (0, 10), (0, 0)],
                                         [(2, 2), (3, 2), (3, 3), (2, 2)]], 4326)],
        "multipoint": [geometry("multipoint", [(1, 1), (2, 2)]), geometry("multipoint", [], 4326)],
        "multilinestring": [geometry("multilinestring", [[(0, 0), (1, 1)], [(2, 2), (3, 3)]], 4326)],
        "multipolygon": [geometry("multipolygon", [[[(0, 0), (1, 0), (1, 1), (0, 0)]],
                                                   [[(5, 5), (6, 5), (6, 6), (5, 5)]]]),
                         geometry("multipolygon", [], 4326)],
        "geometrycollection": [geometry("geometrycollection", [("point", (1, 1)), ("linestring", [(0, 0), (1, 1)])],
                                        4326), geometry("geometrycollection", [])],
    }
    if kind == "geometry":
        return [v for k in ("point", "polygon", "geometrycollection", "multipoint") for v in by_kind[k]]
    return by_kind[kind]


# --- seeded values for fixtures (no hypothesis outside @given) -----------------------------------

def _double(rng) -> float:
    return rng.choice([rng.uniform(-180, 180), rng.uniform(-1e9, 1e9), round(rng.uniform(-90, 90), 6),
                       rng.choice(EDGE_DOUBLES)])


def _random_coords(rng, kind: str):
    point = lambda: (_double(rng), _double(rng))  # noqa: E731

    def ring():
        points = [point() for _ in range(rng.randint(3, 5))]
        return [*points, points[0]]

    return {
        "point": point,
        "linestring": lambda: [point() for _ in range(rng.randint(2, 5))],
        "polygon": lambda: [ring() for _ in range(rng.randint(1, 3))],
        "multipoint": lambda: [point() for _ in range(rng.randint(1, 4))],
        "multilinestring": lambda: [[point() for _ in range(rng.randint(2, 4))] for _ in range(rng.randint(1, 3))],
        "multipolygon": lambda: [[ring() for _ in range(rng.randint(1, 2))] for _ in range(rng.randint(1, 3))],
        "geometrycollection": lambda: [(k, _random_coords(rng, k)) for k in
                                       rng.sample(sorted(set(CODES) - {"geometrycollection"}), rng.randint(0, 3))],
    }[kind]()


def random_value(rng, kind: str) -> bytes:
    """A value for a column of ``kind`` (GEOMETRY: any kind), SRID 0 or 4326."""
    if kind == "geometry":
        kind = rng.choice(sorted(CODES))
    return geometry(kind, _random_coords(rng, kind), rng.choice([0, 4326]))
