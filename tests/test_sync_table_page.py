"""A copy's table page (``/sync/table``): its shape in one place — source, key, layout, what it
holds and whether it keeps deletes (never the salt) — its loads and the pipelines following it,
over a real ledger and ClickHouse."""

from __future__ import annotations

import re

import pytest

from airflow_sync_provider.core.clickhouse.layout import Layout, layout_comment
from airflow_sync_provider.core.content.shaping import Content, content_comment
from airflow_sync_provider.core.shape import copy_shape
from airflow_sync_provider.core.sql import ch_string, ch_table
from airflow_sync_provider.plugins import pages
from tests.ledger_fill import FillLedger, add_load, add_pipeline, fresh

OK = ("success", 100, 100, 0, "")


@pytest.fixture
def book(ch):
    yield from fresh(ch, FillLedger, "sync_table")


def test_a_copys_page_shows_its_whole_shape_its_loads_and_pipelines(book, ch):
    db = book.database
    layout = Layout.of({"order_by": ["status"], "partition_by": "toYYYYMM(day)"})
    content = Content.of({"transform": {"email": "hash"}, "on_delete": "keep"})
    comment = layout_comment(layout, ("id",)) + content_comment(content, b"s3cret-salt")
    ch.command(f"CREATE TABLE {ch_table(db, 'orders')} (id UInt64, status String, day Date, email String)"
               f" ENGINE = MergeTree PARTITION BY toYYYYMM(day) ORDER BY (status, toYYYYMM(day), id)"
               f" COMMENT {ch_string(comment)}")
    add_load(book, "nightly.orders", "shop.orders", f"{db}.orders", "published", [OK, OK])
    add_pipeline(ch, db, "orders_cdc", "idle", ["shop.orders"])
    shape = copy_shape(book, f"{db}.orders")
    assert shape.found and shape.sources == ["shop.orders"]
    assert [lo["load_key"] for lo in shape.loads] == ["nightly.orders"]
    page = pages.table_html(shape)
    assert "ORDER BY (status, toYYYYMM(day), id) · PARTITION BY toYYYYMM(day)" in page
    assert "<code>id</code>" in page and "email: hash" in page and "_deleted_at_source" in page
    assert "s3cret" not in page  # never the salt
    assert "href='load?key=nightly.orders'" in page and "No CDC pipeline follows it." in page
    by_source = copy_shape(book, "shop.orders")  # a source's name finds its copies
    assert [p["pipeline"] for p in by_source.pipelines] == ["orders_cdc"]
    assert not copy_shape(book, "no.such").found


def test_a_keyless_copy_says_it_has_no_key_and_whether_it_is_a_multiset(book, ch):
    """docs/keyless-tables.md: a table without a primary key followed by CDC is a multiset copy
    (signed occurrences, ORDER BY (_version, _ordinal)); a full load's copy of one is a plain
    MergeTree (ORDER BY tuple()). Neither has a key; only the first is signed."""
    from airflow_sync_provider.core.clickhouse.columns import TABLE_COMMENT

    db = book.database
    ch.command(f"CREATE TABLE {ch_table(db, 'tags')} (item UInt64, tag String, _version UInt64 DEFAULT 0,"
               " _deleted UInt8 DEFAULT 0, _ordinal UInt64 DEFAULT 0, _sign Int8 DEFAULT 1)"
               " ENGINE = ReplacingMergeTree(_version) ORDER BY (_version, _ordinal)"
               f" COMMENT {ch_string(TABLE_COMMENT)}")
    add_pipeline(ch, db, "tags_cdc", "idle", ["shop.tags"])
    shape = copy_shape(book, f"{db}.tags")
    assert shape.multiset and shape.facts.key == []
    page = pages.table_html(shape)
    key = re.search(r"<dd id='copy-key'>(.*?)</dd>", page, re.S).group(1)
    assert key.startswith("none: the source table has no primary key, so the copy is a multiset") and "_sign" in key
    assert "<dd id='copy-layout'>ORDER BY (_version, _ordinal): a row per change</dd>" in page

    ch.command(f"CREATE TABLE {ch_table(db, 'log')} (at DateTime, line String, _version UInt64 DEFAULT 0,"
               f" _deleted UInt8 DEFAULT 0) ENGINE = MergeTree ORDER BY tuple() COMMENT {ch_string(TABLE_COMMENT)}")
    add_load(book, "nightly.log", "shop.log", f"{db}.log", "published", [OK])
    plain = copy_shape(book, f"{db}.log")
    assert not plain.multiset and plain.facts.key == []
    page = pages.table_html(plain)
    assert "<dd id='copy-key'>none: the source table has no primary key — a plain MergeTree" in page
    assert "ORDER BY tuple(): the source table has no primary key" in page and "multiset" not in page
