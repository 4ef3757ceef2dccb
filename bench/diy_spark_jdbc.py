"""Do-it-yourself baseline for bench/full_load.py: what a team would write without this provider.

Spark's built-in JDBC source (MariaDB Connector/J) reads the table in ``--partitions`` id ranges;
each partition's Arrow batches go to ClickHouse with a plain clickhouse-connect ``insert_arrow``
into a pre-created MergeTree table. No ledger, no retries, no atomic publish, no value checks.

    DIY_MYSQL_PASSWORD=… DIY_CH_PASSWORD=… spark-submit --master local[2] \\
        --jars /usr/share/java/mariadb-java-client.jar bench/diy_spark_jdbc.py --mysql-port … …

Passwords come from the environment (never argv, which ``ps`` shows to every user).
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--mysql-host", default="127.0.0.1")
    parser.add_argument("--mysql-port", type=int, required=True)
    parser.add_argument("--mysql-user", default="root")
    parser.add_argument("--database", required=True)
    parser.add_argument("--table", default="orders")
    parser.add_argument("--lower", type=int, required=True, help="min(id)")
    parser.add_argument("--upper", type=int, required=True, help="max(id)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--fetchsize", type=int, default=10000)
    parser.add_argument("--batch-rows", type=int, default=65536, help="rows per Arrow batch = per ClickHouse insert")
    parser.add_argument("--ch-host", default="127.0.0.1")
    parser.add_argument("--ch-port", type=int, required=True)
    parser.add_argument("--ch-user", default="default")
    parser.add_argument("--target-database", required=True)
    parser.add_argument("--target-table", required=True)
    parser.add_argument("--result", required=True, help="write {'rows', 'seconds'} here as JSON")
    args = parser.parse_args(argv)
    mysql_password = os.environ.get("DIY_MYSQL_PASSWORD", "")
    ch_password = os.environ.get("DIY_CH_PASSWORD", "")

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.appName("diy-spark-jdbc")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.batch_rows))
             .getOrCreate())
    started = time.perf_counter()
    df = spark.read.jdbc(
        url=f"jdbc:mysql://{args.mysql_host}:{args.mysql_port}/{args.database}",
        table=args.table, column="id", lowerBound=args.lower, upperBound=args.upper + 1,
        numPartitions=args.partitions,
        properties={"user": args.mysql_user, "password": mysql_password, "driver": "org.mariadb.jdbc.Driver",
                    "fetchsize": str(args.fetchsize)})

    ch_args = dict(host=args.ch_host, port=args.ch_port, username=args.ch_user, password=ch_password)
    database, table = args.target_database, args.target_table

    def write(batches):
        import clickhouse_connect
        import pyarrow as pa

        client = clickhouse_connect.get_client(**ch_args)
        rows = 0
        try:
            for batch in batches:
                if batch.num_rows:
                    client.insert_arrow(table, pa.Table.from_batches([batch]), database=database)
                    rows += batch.num_rows
        finally:
            client.close()
        yield pa.RecordBatch.from_pydict({"rows": pa.array([rows], pa.int64())})

    rows = df.mapInArrow(write, "rows long").agg(F.sum("rows")).collect()[0][0] or 0
    seconds = time.perf_counter() - started
    with open(args.result, "w") as fh:
        json.dump({"rows": int(rows), "seconds": round(seconds, 3)}, fh)
    print(f"diy-spark-jdbc: {rows} rows in {seconds:.1f} s", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
