"""A copy's history written by the CDC stream (issue 61, slice 2), on the real services: every
version of every key, with its operation, commit and GTID, against the test's own record of what
it wrote — through a large transaction in pieces and an applier SIGKILLed at the points a batch
passes (the history lane written, a copy's lane written, all written, checkpointed, a piece)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from airflow_sync_provider.core.cdc.history_ledger import HistoryLedger
from airflow_sync_provider.core.clickhouse.history import conflicts_sql
from airflow_sync_provider.core.jobspec import CdcApplySpec, FullLoadSpec
from airflow_sync_provider.core.positions import BinlogPosition, current_position
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import one_server
from airflow_sync_provider.spark.cdc_apply import run_cdc_apply
from airflow_sync_provider.spark.full_load import run_full_load
from tests.helpers import assert_same_rows, recreate_tables

pytestmark = pytest.mark.slow
DB, TARGET = "hist_cdc", "hist_cdc_ch"


class Source:
    """The test's own record of what it wrote: the rows now, and per key each version in commit
    order as (event, v, note, deleted, GTID sequence) — a tombstone keeps the old values."""

    def __init__(self, conn, table: str):
        self.conn, self.table = conn, f"{DB}.{table}"
        self.rows: dict[int, tuple] = {}
        self.log: dict[int, list] = defaultdict(list)
        self.moments: list = []  # (binlog position after a commit, the rows then)

    def prefill(self, n: int) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {self.table} VALUES (%s, %s, %s)", [(i, i, f"n{i}") for i in range(1, n + 1)])
        self.rows.update({i: (i, f"n{i}") for i in range(1, n + 1)})

    def transaction(self, *operations) -> None:
        """``operations``: ("insert", id, v, note), ("update", id, v, note), ("delete", id),
        ("rekey", old, new) — each one statement, all in one transaction."""
        entries = []
        with self.conn.cursor() as cur:
            cur.execute("BEGIN")
            for kind, key, *rest in operations:
                if kind == "insert":
                    cur.execute(f"INSERT INTO {self.table} VALUES (%s, %s, %s)", (key, *rest))
                    self.rows[key] = tuple(rest)
                    entries.append((key, "insert", *rest, 0))
                elif kind == "update":
                    cur.execute(f"UPDATE {self.table} SET v = %s, note = %s WHERE id = %s", (*rest, key))
                    self.rows[key] = tuple(rest)
                    entries.append((key, "update", *rest, 0))
                elif kind == "delete":
                    cur.execute(f"DELETE FROM {self.table} WHERE id = %s", (key,))
                    entries.append((key, "delete", *self.rows.pop(key), 1))
                else:  # a key change: the old key's tombstone, the new key's row, one version
                    new = rest[0]
                    cur.execute(f"UPDATE {self.table} SET id = %s WHERE id = %s", (new, key))
                    entries.append((key, "delete", *self.rows[key], 1))
                    self.rows[new] = self.rows.pop(key)
                    entries.append((new, "update", *self.rows[new], 0))
            cur.execute("COMMIT")
            cur.execute("SELECT @@last_gtid")
            seq = int(cur.fetchone()[0].rsplit("-", 1)[1])
        for key, *entry in entries:
            self.log[key].append((*entry, seq))

    def moment(self) -> None:
        self.moments.append((current_position(self.conn), dict(self.rows)))

    def mixed(self, round_: int, base: int) -> None:
        """A round of transactions: inserts, updates (a key twice in one transaction), deletes,
        key changes; ``base``: the first new key."""
        live = sorted(self.rows)
        self.transaction(("insert", base, round_, "new"), ("insert", base + 1, -round_, None))
        self.transaction(("update", live[0], round_ * 10, "twice"), ("update", live[0], round_ * 10 + 1, None),
                         ("update", live[1], round_, f"r{round_}"))
        self.transaction(("delete", live[2]))
        self.transaction(("rekey", live[3], base + 2))
        self.transaction(("update", base, round_ + 1, "again"), ("delete", base + 1))


def _history(ch, table: str) -> dict[int, list]:
    rows = ch.query(f"SELECT id, _event, v, note, _deleted, _gtid_seq FROM {TARGET}.{table}_history FINAL "
                    "WHERE _via = 'binlog' ORDER BY id, _version").result_rows
    out = defaultdict(list)
    for key, *rest in rows:
        out[key].append(tuple(rest))
    return out


def _check(ch, mysql_conn, source: Source, table: str, pipeline: str) -> None:
    """Every version the test wrote, once; the as-of view at the recorded moments; latest == copy ==
    source; the ledger's records chain and count what the history holds."""
    history = _history(ch, table)
    assert dict(history) == dict(source.log), {k: (history.get(k), source.log.get(k))
                                               for k in set(history) | set(source.log)
                                               if history.get(k) != source.log.get(k)}
    assert ch.query(conflicts_sql(TARGET, table, ("id",))).result_rows == []
    for position, rows in source.moments:
        asof = ch.query(f"SELECT id, v, note FROM {TARGET}.{table}_asof(at_version = {position.version() - 1}) "
                        "ORDER BY id").result_rows
        assert {k: (v, n) for k, v, n in asof} == rows, position
    latest = {k: (v, n) for k, v, n in ch.query(
        f"SELECT id, v, note FROM {TARGET}.{table}_asof(at_version = 18446744073709551615)").result_rows}
    assert latest == source.rows
    assert assert_same_rows(mysql_conn, ch, DB, table, TARGET) == len(source.rows)
    ledger = HistoryLedger(ch)
    name = f"{DB}.{table}"
    assert ledger.breaks(pipeline, name) == []
    applied = ledger.applied(pipeline, name)
    count, total = ch.query(f"SELECT count(), sum(toUInt128(_version)) FROM {TARGET}.{table}_history FINAL "
                            "WHERE _via = 'binlog'").result_rows[0]
    assert (sum(a.rows for a in applied), sum(a.version_sum for a in applied)) == (count, int(total or 0))


def _begin(mysql_conn, ch, endpoints, spark, table: str, rows: int = 40) -> tuple[Source, str]:
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.{table} (id INT PRIMARY KEY, v INT NOT NULL, "
                                    "note VARCHAR(20) NULL)")
    ch.command(f"DROP TABLE IF EXISTS {TARGET}.{table}_history")  # a history begins beside none
    source = Source(mysql_conn, table)
    source.prefill(rows)
    key = f"{DB}.{table}"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table=table, target_database=TARGET, target_table=table, load_key=key,
                               channels=1), spark)
    return source, key


def _spec(endpoints, pipeline: str, **kwargs) -> CdcApplySpec:
    return CdcApplySpec(sources=one_server(endpoints[0]), target=endpoints[1], pipeline=pipeline, lanes=2,
                        tableset=TableSet(content={"history": True}), **kwargs)


def test_every_version_with_its_commit_once_and_the_copy_as_of_three_moments(mysql_conn, ch, endpoints, spark):
    """Changes before the history began are in its baseline (the copy at the checkpoint); after
    it every insert, update (a key twice in one transaction), delete and key change is a version
    of its own, stamped with its transaction's GTID; a large transaction in pieces reaches it
    whole; the as-of view equals the source at three recorded moments."""
    ch.command(f"DROP DATABASE IF EXISTS {TARGET}")
    source, key = _begin(mysql_conn, ch, endpoints, spark, "basic")
    source.mixed(1, 1000)
    source.moment()
    first = run_cdc_apply(_spec(endpoints, "hist.basic", start_from_loads=[key], reset=True), spark)
    assert first["events"] > 0
    # complete from where it began (the checkpoint then: the load's position); before it, a recorded hole
    assert HistoryLedger(ch).complete_from("hist.basic", f"{DB}.basic") == \
        BinlogPosition.from_dict(first["start"]).version()
    baseline = ch.query(f"SELECT id, v, note FROM {TARGET}.basic_history FINAL WHERE _via = 'enable' "
                        "ORDER BY id").result_rows
    assert {k: (v, n) for k, v, n in baseline} == {i: (i, f"n{i}") for i in range(1, 41)}  # as loaded
    source.mixed(2, 2000)
    source.moment()
    # a transaction larger than a batch: in pieces, each written as it comes
    live = sorted(source.rows)
    source.transaction(*[("update", k, k * 3, "big") for k in live[:30]], *[("update", k, -k, None) for k in live[:30]],
                       *[("insert", 3000 + i, i, "bulk") for i in range(40)], *[("delete", k) for k in live[30:35]])
    source.mixed(3, 4000)
    source.moment()
    pieces = run_cdc_apply(_spec(endpoints, "hist.basic", batch_events=25), spark)
    assert pieces["pieces"] >= 3
    _check(ch, mysql_conn, source, "basic", "hist.basic")
    times = ch.query(f"SELECT _gtid_seq, min(_commit_time), max(_commit_time) FROM {TARGET}.basic_history FINAL "
                     "WHERE _via = 'binlog' GROUP BY _gtid_seq ORDER BY _gtid_seq").result_rows
    assert all(low == high for _, low, high in times)  # one commit time per transaction
    assert [t for _, t, _ in times] == sorted(t for _, t, _ in times)  # in commit order
    with mysql_conn.cursor() as cur:  # the server and GTID domain it was committed on
        cur.execute("SELECT @@server_id, @@gtid_domain_id")
        server_id, domain = cur.fetchone()
    assert ch.query(f"SELECT DISTINCT _server, _gtid_domain FROM {TARGET}.basic_history WHERE _via = 'binlog'"
                    ).result_rows == [(f"mariadb:{server_id}:{domain}", str(domain))]


KILLS = ["cdc.history-write:1", "cdc.lane-write:1", "cdc.written:1", "cdc.checkpointed:1", "cdc.piece-written:1"]


def test_killed_at_each_point_a_rerun_writes_every_version_once(mysql_conn, ch, endpoints, spark, monkeypatch):
    """The applier SIGKILLed after the history lane's write, after a copy lane's, after all writes
    (before the record and the checkpoint), after the checkpoint and after a piece: each rerun
    replays from the checkpoint, and the history still holds each version exactly once."""
    from airflow_sync_provider.core.submission import spark_submit

    source, key = _begin(mysql_conn, ch, endpoints, spark, "kills", rows=30)
    run_cdc_apply(_spec(endpoints, "hist.kills", start_from_loads=[key], reset=True), spark)
    for i, point in enumerate(KILLS):
        source.mixed(i, 1000 * (i + 1))
        if point.startswith("cdc.piece"):
            live = sorted(source.rows)
            source.transaction(*[("update", k, k + i, "p") for k in live[:20]], *[("delete", k) for k in live[20:23]])
        source.moment()
        monkeypatch.setenv("AIRFLOW_SYNC_CRASH_AT", point)
        result = spark_submit(_spec(endpoints, "hist.kills", batch_events=12), timeout=120)
        assert result["status"] == "failed" and "exited -9" in result["error"], (point, result)
    monkeypatch.delenv("AIRFLOW_SYNC_CRASH_AT")
    final = run_cdc_apply(_spec(endpoints, "hist.kills"), spark)
    assert final["events"] >= 0
    _check(ch, mysql_conn, source, "kills", "hist.kills")
    # the replays wrote some versions again: they collapsed (the same rows), none differs
    assert ch.command(f"SELECT count() FROM {TARGET}.kills_history") >= ch.command(
        f"SELECT count() FROM {TARGET}.kills_history FINAL")


def test_a_write_the_history_would_miss_stops_the_pipeline_naming_the_table(mysql_conn, ch, endpoints, spark):
    """TRUNCATE (slice 3) and an XA transaction (slice 3) on a table whose copy keeps a history:
    the pipeline stops before writing, its checkpoint before the statement, the copy and its
    history untouched, every retry the same; a full load into the copy is refused as well."""
    from airflow_sync_provider.core.cdc.checkpoints import Checkpoints
    from airflow_sync_provider.core.content import ContentError
    from airflow_sync_provider.core.positions import BinlogError

    for table, statements, match in (
            ("trunc", [f"TRUNCATE TABLE {DB}.trunc"],
             r"table hist_cdc\.trunc: the statement 'TRUNCATE TABLE hist_cdc\.trunc' would change its copy, which "
             r"keeps a history .*slice 3.*TRUNCATE"),
            ("xa", ["XA START 'h1'", f"UPDATE {DB}.xa SET v = -v WHERE id < 3", "XA END 'h1'", "XA PREPARE 'h1'",
                    "XA COMMIT 'h1'"],
             r"table hist_cdc\.xa: the XA transaction .* would change its copy, which keeps a history .*slice 3")):
        source, key = _begin(mysql_conn, ch, endpoints, spark, table, rows=5)
        pipeline = f"hist.{table}"
        run_cdc_apply(_spec(endpoints, pipeline, start_from_loads=[key], reset=True), spark)
        source.transaction(("update", 1, 100, "before"))
        run_cdc_apply(_spec(endpoints, pipeline), spark)
        with mysql_conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
        for _ in range(2):  # a stop, at every retry
            with pytest.raises(BinlogError, match=match):
                run_cdc_apply(_spec(endpoints, pipeline), spark)
            assert Checkpoints(ch).state(pipeline).status == "stopped"
        copy = dict(ch.query(f"SELECT id, v FROM {TARGET}.{table} FINAL WHERE _deleted = 0").result_rows)
        assert copy == {1: 100, **{i: i for i in range(2, 6)}}  # the update before it, nothing of it
        assert _history(ch, table) == source.log
        with pytest.raises(ContentError, match=rf"table {TARGET}\.{table}: its copy keeps a history .*which this "
                                               r"job's content settings leave out"):
            run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                                       source_table=table, target_database=TARGET, target_table=table,
                                       load_key=f"{key}.again", channels=1), spark)


def test_a_reimport_of_a_followed_copy_fixes_the_copy_and_leaves_a_right_history_as_it_was(mysql_conn, ch,
                                                                                             endpoints, spark):
    """A followed copy with a history found wrong (a row damaged by hand; its history right):
    reconcile's re-import rewrites the copy's row and writes no event — the history already held
    the source's value — and every version the stream wrote stays as it was."""
    from airflow_sync_provider.core.jobspec import ReconcileSpec
    from airflow_sync_provider.spark.reconcile import run_reconcile

    source, key = _begin(mysql_conn, ch, endpoints, spark, "mend", rows=20)
    run_cdc_apply(_spec(endpoints, "hist.mend", start_from_loads=[key], reset=True), spark)
    source.transaction(("update", 3, 33, "x"), ("delete", 4))
    run_cdc_apply(_spec(endpoints, "hist.mend"), spark)
    everything = f"SELECT * FROM {TARGET}.mend_history FINAL ORDER BY id, _version"
    before = ch.query(everything).result_rows
    ch.command(f"INSERT INTO {TARGET}.mend (id, v, note, _version) SELECT id, v + 1, note, _version + 1 "
               f"FROM {TARGET}.mend FINAL WHERE id = 5")  # damage one row of the copy alone
    check = ReconcileSpec(sources=one_server(endpoints[0]), target=endpoints[1], load_key=key, checksum=True,
                          reimport=True)
    result = run_reconcile(check, spark)
    assert result["before"]["verdict"] == "mismatch" and result["verdict"] == "ok", result
    assert ch.command(f"SELECT v FROM {TARGET}.mend FINAL WHERE id = 5") == 5
    assert ch.query(everything).result_rows == before  # no event: nothing the history held was wrong
    assert _history(ch, "mend") == source.log
    latest = ch.query(f"SELECT id, v, note FROM {TARGET}.mend_asof(at_version = 18446744073709551615)").result_rows
    assert {k: (v, n) for k, v, n in latest} == source.rows
    assert assert_same_rows(mysql_conn, ch, DB, "mend", TARGET) == len(source.rows)


def test_a_shaped_copys_history_holds_no_clear_value_and_its_kept_deletes_as_absences(mysql_conn, ch, endpoints,
                                                                                       spark):
    """A copy with a hashed column that keeps deletes: its history is written from the copy's rows,
    so no clear value of the hashed column reaches it; a delete the copy keeps (live, marked) is an
    absence in the history, so the as-of view leaves it out."""
    recreate_tables(mysql_conn, DB, f"CREATE TABLE {DB}.shaped (id INT PRIMARY KEY, email VARCHAR(40) NOT NULL, "
                                    "v INT NOT NULL)")
    ch.command(f"DROP TABLE IF EXISTS {TARGET}.shaped_history")
    with mysql_conn.cursor() as cur:
        cur.executemany(f"INSERT INTO {DB}.shaped VALUES (%s, %s, %s)", [(i, f"u{i}@x", i) for i in range(1, 11)])
    content, salt = {"transform": {"email": "hash"}, "on_delete": "keep"}, "s3cret"
    key = f"{DB}.shaped"
    run_full_load(FullLoadSpec(sources=one_server(endpoints[0]), target=endpoints[1], source_database=DB,
                               source_table="shaped", target_database=TARGET, target_table="shaped", load_key=key,
                               channels=1, tableset=TableSet(content=content), hash_salt=salt), spark)
    spec = _spec(endpoints, "hist.shaped", start_from_loads=[key], reset=True)
    spec.hash_salt = salt
    run_cdc_apply(spec, spark)
    with mysql_conn.cursor() as cur:
        cur.execute(f"UPDATE {DB}.shaped SET email = 'new@x', v = -v WHERE id <= 3")
        cur.execute(f"INSERT INTO {DB}.shaped VALUES (11, 'eleven@x', 11)")
        cur.execute(f"DELETE FROM {DB}.shaped WHERE id IN (4, 5)")
        cur.execute(f"SELECT id, email FROM {DB}.shaped")
        clear = {email for _, email in cur.fetchall()} | {f"u{i}@x" for i in range(1, 11)}
    spec = _spec(endpoints, "hist.shaped")
    spec.hash_salt = salt
    run_cdc_apply(spec, spark)
    emails = {e for (e,) in ch.query(f"SELECT DISTINCT toString(email) FROM {TARGET}.shaped_history").result_rows}
    assert len(emails) >= 12 and not emails & clear  # hashed, as in the copy
    assert ch.query(f"SELECT id, _event FROM {TARGET}.shaped_history FINAL WHERE _deleted = 1 ORDER BY id"
                    ).result_rows == [(4, "delete"), (5, "delete")]
    asof = {k: v for k, v in ch.query(f"SELECT id, v FROM {TARGET}.shaped_asof(at_version = 18446744073709551615)"
                                      ).result_rows}
    assert asof == {**{i: -i for i in (1, 2, 3)}, **{i: i for i in range(6, 12)}}
    kept = ch.query(f"SELECT id FROM {TARGET}.shaped FINAL WHERE _deleted_at_source > 0 ORDER BY id").result_rows
    assert kept == [(4,), (5,)]  # the copy keeps them, marked; the history says they are gone
