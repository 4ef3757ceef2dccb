"""The peers our jobs are measured against: mysql-ch-replicator (its own venv, devenv/peers.py) and
a do-it-yourself Spark job under spark-submit (MariaDB Connector/J)."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import yaml

from bench.harness.clients import source, target
from bench.harness.env import REPO
from bench.harness.measure import timer


def replicator_config(mysql_url, ch_url, data_dir: str, database: str, tables, target_database: str,
                      **extra) -> dict:
    my, chp = source(mysql_url), target(ch_url)
    return {
        "mysql": {"host": my.host, "port": my.port, "user": my.user, "password": my.password, "charset": "utf8mb4"},
        "clickhouse": {"host": chp.host, "port": chp.port, "user": chp.user, "password": chp.password,
                       "connection_timeout": 30, "send_receive_timeout": 600},
        "binlog_replicator": {"data_dir": data_dir, "records_per_file": 100000},
        "databases": database,
        "tables": tables,
        "target_databases": {database: target_database},
        "log_level": "info",
        **extra,
    }


def write_config(directory, config: dict) -> str:
    path = Path(directory) / "config.yaml"
    path.write_text(yaml.safe_dump(config))  # holds the password: in a private temp dir
    os.chmod(path, 0o600)
    return str(path)


def peer_env() -> dict:
    """The environment for a peer's own venv: none of this project's settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("MYSQL_", "CLICKHOUSE_", "PYTHON", "VIRTUAL_ENV"))}


def stop_group(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM its process group (the peer stops gracefully on it), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def initial_copy(mysql_url, ch_url, database: str, tables, target_database: str, timeout: float,
                 threads: int | None = None) -> dict:
    """mysql-ch-replicator's initial copy (``db_replicator --initial_only=True``) of ``tables``
    (a list, or "*") of ``database`` into ``target_database``, ``threads`` worker processes (its
    ``initial_replication_threads``). Returns ``code`` (None: stopped at ``timeout``, its workers
    too), ``output`` and ``wall`` (the process, Python start-up included)."""
    from devenv.peers import peer_venv

    venv = peer_venv("mysql-ch-replicator")
    with tempfile.TemporaryDirectory(prefix="bench-mcr-") as tmp:
        extra = {"initial_replication_threads": threads} if threads else {}
        config = write_config(tmp, replicator_config(mysql_url, ch_url, os.path.join(tmp, "data"), database, tables,
                                                     target_database, **extra))
        cmd = [str(venv / "bin" / "mysql_ch_replicator"), "db_replicator", "--config", config, "--db", database,
               "--initial_only=True"]
        with timer() as wall:
            # Its own session, so a timeout can end the workers it starts too (they share its group).
            proc = subprocess.Popen(cmd, cwd=tmp, env=peer_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            try:
                output = proc.communicate(timeout=timeout)[0]
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                output = None
    return {"code": None if output is None else proc.returncode, "output": output or "", "wall": wall["seconds"]}


# --- a do-it-yourself Spark job (spark-submit + MariaDB Connector/J) ------------------------------

MARIADB_JAR = "/usr/share/java/mariadb-java-client.jar"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
SPARK_SUBMIT = REPO / ".venv" / "bin" / "spark-submit"


def diy_available() -> bool:
    """The DIY paths need MariaDB Connector/J (Debian's libmariadb-java): installed if missing."""
    if os.path.exists(MARIADB_JAR):
        return True
    print(f"{MARIADB_JAR} is missing: installing libmariadb-java for the DIY Spark JDBC path", flush=True)
    for cmd in (["apt-get", "install", "-y", "-q", "libmariadb-java"], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "libmariadb-java"]):
        if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0 \
                and os.path.exists(MARIADB_JAR):
            return True
    print("could not install libmariadb-java: the DIY Spark JDBC path is skipped", flush=True)
    return False


def diy_submit(script, mysql_url, ch_url, args: list[str], conf: dict | None = None) -> tuple[list[str], dict]:
    """(command, environment) of ``spark-submit --master local[2] --jars <Connector/J> script
    --mysql-host … --mysql-port … --mysql-user … --ch-host … --ch-port … --ch-user … args``; the
    passwords in DIY_MYSQL_PASSWORD and DIY_CH_PASSWORD (never on argv, which ``ps`` shows)."""
    my, chp = source(mysql_url), target(ch_url)
    confs = {"spark.ui.enabled": "false", "spark.log.level": "WARN", **(conf or {})}
    cmd = [str(SPARK_SUBMIT), "--master", "local[2]", "--jars", MARIADB_JAR,
           *(x for key, value in confs.items() for x in ("--conf", f"{key}={value}")), str(script),
           "--mysql-host", my.host, "--mysql-port", str(my.port), "--mysql-user", my.user,
           "--ch-host", chp.host, "--ch-port", str(chp.port), "--ch-user", chp.user, *args]
    env = {**os.environ, "PYSPARK_PYTHON": str(VENV_PYTHON), "PYSPARK_DRIVER_PYTHON": str(VENV_PYTHON),
           "SPARK_LOCAL_IP": "127.0.0.1", "DIY_MYSQL_PASSWORD": my.password, "DIY_CH_PASSWORD": chp.password}
    return cmd, env
