"""Full load on the Spark standalone cluster (devenv/spark_cluster.py: master + 2 workers of 1
core, worker b in its own network namespace, databases reached through the veth pair) vs the
same job on ``local[2]``, same table, same machine, one run; and the rows/s each executor
achieved (from the ledger's per-shard executor and seconds).

    .venv/bin/python -m bench.cluster [--rows 1000000] [--channels 4]

Needs root (network namespaces). Services: private MariaDB + chDB endpoint under $BENCH_STATE
(default /tmp/airflow-sync-bench-cluster), or MYSQL_URL / CLICKHOUSE_URL.
"""

from __future__ import annotations

import argparse
import collections
import tempfile

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import FullLoadSpec
from airflow_sync_provider.core.ledger import Ledger
from airflow_sync_provider.core.submission import spark_submit
from airflow_sync_provider.core.target.clickhouse import client
from bench.common import machine, services, timer, write_result
from devenv import demo_data
from devenv.spark_cluster import SparkCluster

DB = "bench_cluster"


def load(source, target, key, channels, master, conf=None) -> dict:
    spec = FullLoadSpec(source=source, target=target, source_database=DB, source_table="orders",
                        target_database=f"{DB}_ch", target_table=key.replace(".", "_"), load_key=key,
                        channels=channels)
    with timer() as wall:
        result = spark_submit(spec, master=master, conf=conf, timeout=3600)
    if result.get("status") != "success":
        raise RuntimeError(f"{master}: {result.get('error')}")
    return result | {"wall": wall["seconds"]}


def per_executor(target, key) -> dict:
    ch = client(target)
    state = Ledger(ch).state(key)
    ch.close()
    rows, seconds = collections.Counter(), collections.Counter()
    for shard in state.shards.values():
        rows[shard.executor] += shard.records_written
        seconds[shard.executor] += shard.seconds
    return {e: (rows[e], seconds[e]) for e in rows}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--channels", type=int, default=4)
    args = parser.parse_args(argv)
    with services("cluster") as (mysql_url, ch_url):
        demo_data.generate(mysql_url, DB, orders=args.rows, customers=10_000, item_orders=1_000)
        mysql, ch = MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(ch_url)
        local = load(mysql, ch, f"{DB}.local", args.channels, "local[2]")
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp, SparkCluster(tmp) as cluster:
            source = MySQLEndpoint(cluster.host_ip, cluster.expose(mysql.port), mysql.user, mysql.password)
            target = ClickHouseEndpoint(cluster.host_ip, cluster.expose(ch.port), ch.user, ch.password)
            remote = load(source, target, f"{DB}.cluster", args.channels, cluster.url, cluster.driver_conf)
            executors = per_executor(target, f"{DB}.cluster")
            names = {cluster.host_ip: "worker a (host namespace)", cluster.netns.ns_ip: "worker b (own namespace)"}
    lines = [
        "# Full load on a Spark standalone cluster vs local[2]", "",
        f"Machine: {machine()}. One run, `python -m bench.cluster --rows {args.rows} --channels {args.channels}`.",
        "The cluster is on this same 2-core machine (master + 2 workers × 1 core, worker b in its own network",
        "namespace; MySQL and ClickHouse reached through the veth pair via a forwarder). The ClickHouse endpoint is",
        "the chDB stand-in, which runs one statement at a time.", "",
        "| run | wall s | in-job s | rows | rows/s (wall) |", "|---|---:|---:|---:|---:|",
    ]
    for label, run in (("local[2]", local), ("standalone cluster, client mode", remote)):
        lines.append(f"| {label} | {run['wall']:.1f} | {run['seconds']:.1f} | {run['rows']:,} | "
                     f"{run['rows'] / run['wall']:,.0f} |")
    lines += ["", f"Cluster / local[2] wall: {remote['wall'] / local['wall']:.2f}×", "",
              "| executor | rows | shard-seconds | rows/s per executor core |", "|---|---:|---:|---:|"]
    for executor, (rows, seconds) in sorted(executors.items()):
        address = executor.split("/")[-1]
        lines.append(f"| {names.get(address, executor)} | {rows:,} | {seconds:.1f} | {rows / seconds:,.0f} |")
    write_result("cluster", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
