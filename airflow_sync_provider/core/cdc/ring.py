"""Consistent hashing with virtual nodes (patent S11x): routes a row change to an apply lane.

Every (table, primary key) always lands on the same lane, so one key's changes are written in
binlog order by one writer; changing the number of lanes moves only about 1/N of the keys
(a new lane takes over slices of the circle from the others, nothing else moves).
"""

from __future__ import annotations

import bisect
import hashlib


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, lanes: int, vnodes: int = 256):
        if lanes < 1 or vnodes < 1:
            raise ValueError(f"a hash ring needs lanes >= 1 and vnodes >= 1, got {lanes} and {vnodes}")
        self.lanes, self.vnodes = lanes, vnodes
        points = sorted((_hash(f"lane-{lane}#{v}".encode()), lane) for lane in range(lanes) for v in range(vnodes))
        self._points = [p for p, _ in points]
        self._owners = [lane for _, lane in points]

    def lane(self, key: bytes) -> int:
        """The lane owning ``key``: the first virtual node clockwise from the key's hash."""
        i = bisect.bisect_right(self._points, _hash(key))
        return self._owners[i % len(self._points)]

    def router(self, table: str):
        """The lane of a key of ``table``, as ``lane(route_key(table, key))`` (the reader's per-row
        path: names resolved once)."""
        points, owners, size, digest, find = self._points, self._owners, len(self._points), hashlib.blake2b, \
            bisect.bisect_right
        head = table + "\x1f"

        def lane(key: tuple) -> int:
            if len(key) == 1:
                value = key[0]
                text = head + (value.hex() if isinstance(value, bytes) else repr(value))
            else:
                text = "\x1f".join([table, *(v.hex() if isinstance(v, bytes) else repr(v) for v in key)])
            return owners[find(points, int.from_bytes(digest(text.encode(), digest_size=8).digest(), "big")) % size]

        return lane


def route_key(table: str, key: tuple) -> bytes:
    """The bytes a row change is routed by: its table and primary-key values (as stored)."""
    return "\x1f".join([table, *(v.hex() if isinstance(v, bytes) else repr(v) for v in key)]).encode()
