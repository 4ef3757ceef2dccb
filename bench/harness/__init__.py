"""The benches' one harness, by concern (a bench imports what it uses from each):

* env.py — services (a private MariaDB and the chDB endpoint under $BENCH_STATE, or MYSQL_URL /
  CLICKHOUSE_URL; the TLS pair), the machine's description, result files;
* clients.py — clients opened through the endpoints only (``mysql``: ``MySQLEndpoint.connect``;
  ``ch_client``: core/clickhouse/clickhouse.client), the bench's databases on both sides;
* measure.py — timing, load averages, rates, percentiles, medians and ranges of rounds, and the
  result files' way of writing numbers;
* processes.py — ``ProcessSampler``: the CPU of every process a job starts (its binlog readers,
  forked by a fork server that outlives the driver, included), by role; the services' CPU, other
  work's, and peak memory;
* jobs.py — the full-load runner every bench shares (``full_load``), a copy's content fingerprint;
* peers.py — mysql-ch-replicator's initial copy and configuration, a do-it-yourself job under
  spark-submit.
"""
