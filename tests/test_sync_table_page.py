"""A copy's table page (``/sync/table``): its shape in one place — source, key, layout, what it
holds and whether it keeps deletes (never the salt) — its loads and the pipelines following it,
over a real ledger and ClickHouse."""

from __future__ import annotations

import uuid

import pytest

from airflow_sync_provider.core.clickhouse.layout import Layout, layout_comment
from airflow_sync_provider.core.content.shaping import Content, content_comment
from airflow_sync_provider.core.shape import copy_shape
from airflow_sync_provider.core.sql import ch_string, ch_table
from airflow_sync_provider.plugins import pages
from tests.ledger_fill import FillLedger, add_load, add_pipeline

OK = ("success", 100, 100, 0, "")


@pytest.fixture
def book(ch):
    ledger = FillLedger(ch, f"sync_table_{uuid.uuid4().hex[:8]}")
    ledger.ensure()
    yield ledger
    ch.command(f"DROP DATABASE IF EXISTS {ledger.database}")


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
