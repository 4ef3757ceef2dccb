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
from airflow_sync_provider.core.ledger import Ledger
from bench.harness.clients import ch_client, source, target
from bench.harness.env import machine, services, write_result
from bench.harness.jobs import full_load
from devenv import demo_data
from devenv.spark_cluster import SparkCluster

DB = "bench_cluster"


def load(mysql, ch, key, channels, master, conf=None) -> dict:
    return full_load(mysql, ch, DB, "orders", f"{DB}_ch", key.replace(".", "_"), load_key=key,
                     channels=channels, master=master, conf=conf, timeout=3600)


def per_executor(endpoint, key) -> dict:
    ch = ch_client(endpoint)
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
        mysql, ch = source(mysql_url), target(ch_url)
        local = load(mysql, ch, f"{DB}.local", args.channels, "local[2]")
        with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp, SparkCluster(tmp) as cluster:
            there = (MySQLEndpoint(cluster.host_ip, cluster.expose(mysql.port), mysql.user, mysql.password),
                     ClickHouseEndpoint(cluster.host_ip, cluster.expose(ch.port), ch.user, ch.password))
            remote = load(*there, f"{DB}.cluster", args.channels, cluster.url, cluster.driver_conf)
            executors = per_executor(there[1], f"{DB}.cluster")
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
        lines.append(f"| {label} | {run['wall']:.1f} | {run['inner']:.1f} | {run['rows']:,} | "
                     f"{run['rows'] / run['wall']:,.0f} |")
    lines += ["", f"Cluster / local[2] wall: {remote['wall'] / local['wall']:.2f}×", "",
              "| executor | rows | shard-seconds | rows/s per executor core |", "|---|---:|---:|---:|"]
    for executor, (rows, seconds) in sorted(executors.items()):
        address = executor.split("/")[-1]
        lines.append(f"| {names.get(address, executor)} | {rows:,} | {seconds:.1f} | {rows / seconds:,.0f} |")
    write_result("cluster", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
