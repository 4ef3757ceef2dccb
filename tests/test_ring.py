"""The apply lanes' consistent-hash ring (core/cdc/ring.py)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_sync_provider.core.cdc.ring import HashRing, route_key

KEYS = [route_key("shop.orders", (i,)) for i in range(100_000)]


def test_keys_spread_evenly_over_8_lanes_with_256_virtual_nodes():
    ring = HashRing(8, 256)
    load = Counter(ring.lane(k) for k in KEYS)
    assert set(load) == set(range(8))
    assert max(load.values()) / (len(KEYS) / 8) <= 1.15, load


def test_a_9th_lane_moves_about_one_ninth_of_the_keys_and_only_to_itself():
    before, after = HashRing(8, 256), HashRing(9, 256)
    moved = [(before.lane(k), after.lane(k)) for k in KEYS if before.lane(k) != after.lane(k)]
    assert len(moved) <= 1.3 / 9 * len(KEYS), len(moved)
    assert all(new == 8 for _, new in moved)  # nothing moves between the old lanes


@given(st.lists(st.one_of(st.integers(), st.text(), st.binary()), min_size=1, max_size=3), st.integers(1, 16))
def test_a_key_always_lands_on_the_same_lane(key, lanes):
    ring = HashRing(lanes, 16)
    routed = route_key("db.t", tuple(key))
    assert ring.lane(routed) == HashRing(lanes, 16).lane(routed) < lanes


def test_bad_ring_sizes_are_refused():
    with pytest.raises(ValueError, match="lanes >= 1"):
        HashRing(0)


@given(st.lists(st.one_of(st.integers(), st.text(), st.binary(), st.decimals(allow_nan=False), st.datetimes()),
                min_size=1, max_size=3), st.integers(1, 16))
def test_a_tables_router_gives_the_rings_lane_of_its_route_key(key, lanes):
    ring = HashRing(lanes, 16)
    assert ring.router("db.t")(tuple(key)) == ring.lane(route_key("db.t", tuple(key)))
