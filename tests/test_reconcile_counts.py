"""Per-shard counts on the target with the load's own plan (reconciliation building block)."""

from __future__ import annotations

import pytest

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.mysql_schema import read_table_schema
from airflow_sync_provider.core.planning import Plan
from airflow_sync_provider.core.reconcile import NotComparable, count_source, count_target, target_predicates
from airflow_sync_provider.core.submission import spark_submit

pytestmark = pytest.mark.slow
COMPARABLE = ["bigint_unsigned", "decimal_65_30", "double_key", "dt6_in_range", "binary_key", "nullable_key",
              "composite_pk", "boolean_key"]


@pytest.fixture(scope="module")
def in_range_datetimes(matrix):
    """DATETIME(6) keys, thousands in one second, inside ClickHouse's range (the matrix's own
    table also holds year 1000 and 9999, which a load rightly refuses)."""
    from tests.adversarial import DB

    with matrix.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {DB}.dt6_in_range")
        cur.execute(f"CREATE TABLE {DB}.dt6_in_range (k DATETIME(6) PRIMARY KEY)")
        cur.execute(f"INSERT INTO {DB}.dt6_in_range SELECT TIMESTAMP('2024-02-29 23:59:59') + INTERVAL seq MICROSECOND"
                    f" FROM {DB}.seq_1_to_3000")
        cur.execute(f"INSERT INTO {DB}.dt6_in_range VALUES ('1900-01-01 00:00:00'), ('2299-12-31 23:59:59.999999')")


def load(matrix, mysql_url, clickhouse_url, name, strategy="balanced", target_table=None):
    from tests.adversarial import DB, SPLIT

    key = f"reconcile.{target_table or name}.{strategy}"
    spec = FullLoadSpec(source=MySQLEndpoint.from_url(mysql_url), target=ClickHouseEndpoint.from_url(clickhouse_url),
                        source_database=DB, source_table=name, target_database=f"{DB}_rc",
                        target_table=target_table or name,
                        load_key=key, split_column=SPLIT.get(name), strategy=strategy, channels=2)
    assert spark_submit(spec, timeout=600)["status"] == "success"
    return key


def shard_counts(matrix, ch, key, name, target=None):
    from tests.adversarial import DB

    state = Ledger(ch).state(key)
    plan = Plan.from_dict(state.plan)
    schema = read_table_schema(matrix, DB, name)
    column = schema.column(plan.split_column) if plan.split_column else None
    return plan, count_source(matrix, plan), count_target(ch, f"{DB}_rc", target or name,
                                                          target_predicates(plan, column))


@pytest.fixture(scope="module")
def loaded(matrix, in_range_datetimes, mysql_url, clickhouse_url):
    """Every comparable matrix table loaded once (balanced): {table: load key}."""
    return {name: load(matrix, mysql_url, clickhouse_url, name) for name in COMPARABLE}


def test_every_shard_counts_the_same_on_both_sides(matrix, loaded, mysql_url, clickhouse_url, ch):
    for name, key in loaded.items():
        plan, source, target = shard_counts(matrix, ch, key, name)
        assert len(plan.shards) >= 3 and sum(source) > 0
        assert source == target, (name, source, target)
    key = load(matrix, mysql_url, clickhouse_url, "dt6_in_range", strategy="equal")
    _, source, target = shard_counts(matrix, ch, key, "dt6_in_range")
    assert source == target


def test_injected_differences_land_in_the_right_shard(matrix, mysql_url, clickhouse_url, ch):
    from tests.adversarial import DB

    key = load(matrix, mysql_url, clickhouse_url, "bigint_unsigned", target_table="bu_injected")
    table = f"`{DB}_rc`.bu_injected"
    plan, source, _ = shard_counts(matrix, ch, key, "bigint_unsigned", "bu_injected")
    # unmerged duplicate versions of a row are not a difference (FINAL)
    ch.command(f"INSERT INTO {table} SELECT * REPLACE (_version + 1 AS _version) FROM {table} WHERE k = 0")
    assert shard_counts(matrix, ch, key, "bigint_unsigned", "bu_injected")[2] == source
    # a missing row (the max key: the last range shard) and an extra row (in the first shard)
    ch.command(f"DELETE FROM {table} WHERE k = 18446744073709551615")
    ch.command(f"INSERT INTO {table} (k, v, _version) VALUES (1, 0, 1)")
    _, _, target = shard_counts(matrix, ch, key, "bigint_unsigned", "bu_injected")
    differ = [i for i, (s, t) in enumerate(zip(source, target)) if s != t]
    last_range = len(plan.shards) - 2
    assert differ == [0, last_range] and target[0] == source[0] + 1 and target[last_range] == source[last_range] - 1


def test_collated_string_split_is_refused_clearly(matrix):
    from tests.adversarial import DB

    schema = read_table_schema(matrix, DB, "emoji_4byte")
    plan = Plan(DB, "emoji_4byte", "k", "PRIMARY", "balanced", 1, 5, ())
    with pytest.raises(NotComparable, match="emoji_4byte: split column 'k'.*collation"):
        target_predicates(plan, schema.column("k"))


def checksums(matrix, ch, key, name, database_suffix="_rc"):
    from airflow_sync_provider.core.reconcile import checksum_source, checksum_target
    from tests.adversarial import DB

    state = Ledger(ch).state(key)
    plan = Plan.from_dict(state.plan)
    schema = read_table_schema(matrix, DB, name)
    column = schema.column(plan.split_column) if plan.split_column else None
    predicates = target_predicates(plan, column)
    return (checksum_source(matrix, schema, plan),
            checksum_target(ch, schema, f"{DB}{database_suffix}", name, predicates, final=bool(schema.primary_key)))


def test_checksums_agree_on_exact_copies(matrix, loaded, ch):
    for name, key in loaded.items():
        source, target = checksums(matrix, ch, key, name)
        assert source == target, (name, source, target)


def test_checksums_find_each_content_change_in_its_shard(matrix, mysql_url, clickhouse_url, ch):
    from tests.adversarial import DB

    with matrix.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {DB}.content")
        cur.execute(f"CREATE TABLE {DB}.content (id INT PRIMARY KEY, s VARCHAR(10) NULL, d DECIMAL(12, 2) NOT NULL,"
                    f" t DATETIME(3) NOT NULL, f DOUBLE NULL)")
        cur.execute(f"INSERT INTO {DB}.content SELECT seq, IF(seq % 5 = 0, NULL, CONCAT('s', seq)), seq / 100,"
                    f" TIMESTAMP('2025-01-01 00:00:00.123') + INTERVAL seq SECOND, seq / 7 FROM {DB}.seq_1_to_1000")
    key = load(matrix, mysql_url, clickhouse_url, "content")
    clean_source, clean_target = checksums(matrix, ch, key, "content")
    assert clean_source == clean_target
    plan = Plan.from_dict(Ledger(ch).state(key).plan)
    table = f"`{DB}_rc`.content"
    changes = {  # id → a change that keeps the row count
        5: "s = ''",  # a NULL became an empty string
        301: "d = 3.0",  # 3.01 lost its second decimal digit
        501: "t = toDateTime64('2025-01-01 00:08:21', 3, 'UTC')",  # a datetime lost its fraction (.123)
        777: "s = 's778'",  # a changed value, same counts
    }
    for row_id, assignment in changes.items():
        ch.command(f"ALTER TABLE {table} UPDATE {assignment} WHERE id = {row_id} SETTINGS mutations_sync = 2")
    source, target = checksums(matrix, ch, key, "content")
    differ = {i for i, (s, t) in enumerate(zip(source, target)) if s != t}
    assert all(s[0] == t[0] for s, t in zip(source, target))  # counts alone see nothing
    expected = set()
    for row_id in changes:
        with matrix.cursor() as cur:
            hits = [i for i, shard in enumerate(plan.shards)
                    if cur.execute(f"SELECT COUNT(*) FROM {DB}.content WHERE id = %s AND ({shard.where})",
                                   (row_id, *shard.params)) is not None and cur.fetchone()[0]]
        expected |= set(hits)
    assert differ == expected and len(expected) >= 2
