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


def load(matrix, mysql_url, clickhouse_url, name, strategy="balanced"):
    from tests.adversarial import DB, SPLIT

    key = f"reconcile.{name}.{strategy}"
    spec = FullLoadSpec(source=MySQLEndpoint.from_url(mysql_url), target=ClickHouseEndpoint.from_url(clickhouse_url),
                        source_database=DB, source_table=name, target_database=f"{DB}_rc", target_table=name,
                        load_key=key, split_column=SPLIT.get(name), strategy=strategy, channels=2)
    assert spark_submit(spec, timeout=600)["status"] == "success"
    return key


def shard_counts(matrix, ch, key, name):
    from tests.adversarial import DB

    state = Ledger(ch).state(key)
    plan = Plan.from_dict(state.plan)
    schema = read_table_schema(matrix, DB, name)
    column = schema.column(plan.split_column) if plan.split_column else None
    return plan, count_source(matrix, plan), count_target(ch, f"{DB}_rc", name, target_predicates(plan, column))


def test_every_shard_counts_the_same_on_both_sides(matrix, in_range_datetimes, mysql_url, clickhouse_url, ch):
    for name in COMPARABLE:
        key = load(matrix, mysql_url, clickhouse_url, name)
        plan, source, target = shard_counts(matrix, ch, key, name)
        assert len(plan.shards) >= 3 and sum(source) > 0
        assert source == target, (name, source, target)
    key = load(matrix, mysql_url, clickhouse_url, "dt6_in_range", strategy="equal")
    _, source, target = shard_counts(matrix, ch, key, "dt6_in_range")
    assert source == target


def test_injected_differences_land_in_the_right_shard(matrix, mysql_url, clickhouse_url, ch):
    from tests.adversarial import DB

    key = load(matrix, mysql_url, clickhouse_url, "bigint_unsigned")
    table = f"`{DB}_rc`.bigint_unsigned"
    plan, source, _ = shard_counts(matrix, ch, key, "bigint_unsigned")
    # unmerged duplicate versions of a row are not a difference (FINAL)
    ch.command(f"INSERT INTO {table} SELECT * REPLACE (_version + 1 AS _version) FROM {table} WHERE k = 0")
    assert shard_counts(matrix, ch, key, "bigint_unsigned")[2] == source
    # a missing row (the max key: the last range shard) and an extra row (in the first shard)
    ch.command(f"DELETE FROM {table} WHERE k = 18446744073709551615")
    ch.command(f"INSERT INTO {table} (k, v, _version) VALUES (1, 0, 1)")
    _, _, target = shard_counts(matrix, ch, key, "bigint_unsigned")
    differ = [i for i, (s, t) in enumerate(zip(source, target)) if s != t]
    last_range = len(plan.shards) - 2
    assert differ == [0, last_range] and target[0] == source[0] + 1 and target[last_range] == source[last_range] - 1


def test_collated_string_split_is_refused_clearly(matrix):
    from tests.adversarial import DB

    schema = read_table_schema(matrix, DB, "emoji_4byte")
    plan = Plan(DB, "emoji_4byte", "k", "PRIMARY", "balanced", 1, 5, ())
    with pytest.raises(NotComparable, match="emoji_4byte: split column 'k'.*collation"):
        target_predicates(plan, schema.column("k"))
