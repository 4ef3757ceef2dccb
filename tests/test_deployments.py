"""The spark-submit command for each deployment (as Airflow's own Spark provider tests do): local,
standalone client, YARN cluster and Kubernetes cluster; where the spec and the secrets go; and a
cluster-mode driver run for real (spec without passwords, passwords from its environment, result
through the ledger)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from airflow.providers.apache.spark.hooks import spark_submit as spark_submit_module

from airflow_sync_provider.core.endpoints import ClickHouseEndpoint, MySQLEndpoint
from airflow_sync_provider.core.jobspec import ReconcileSpec
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.source.group import Merge, one_server
from airflow_sync_provider.core.specfile import read_spec
from airflow_sync_provider.core.submission import SECRET_ENV, job_script, stage
from airflow_sync_provider.operators.reconcile import ReconcileOperator

MYSQL_SECRET, CH_SECRET = "my-Secret-41", "ch-Secret-42"
CONNECTIONS = {
    "local": {"conn_type": "spark", "host": "local[2]"},
    "standalone": {"conn_type": "spark", "host": "spark://10.1.2.3", "port": 7077},
    "yarn_cluster": {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster", "queue": "etl"}},
    "k8s_cluster": {"conn_type": "spark", "host": "k8s://https://k8s.example:443",
                    "extra": {"deploy-mode": "cluster", "namespace": "sync"}},
}


def _spec() -> ReconcileSpec:
    return ReconcileSpec(sources=one_server(MySQLEndpoint("db.example", 3306, "reader", MYSQL_SECRET)),
                         target=ClickHouseEndpoint("ch.example", 8123, "sync", CH_SECRET), load_key="k")


def _command(monkeypatch, tmp_path, name, **operator_args):
    for conn_id, conn in CONNECTIONS.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_SPARK_{conn_id.upper()}", json.dumps(conn))
    monkeypatch.setattr(spark_submit_module, "kube_client", object(), raising=False)  # a Kubernetes API we cannot run
    operator = ReconcileOperator(task_id="t", load_key="k", spark_conn_id=f"spark_{name}", **operator_args)
    spec = _spec()
    hook, staged = operator.submit_hook(spec, str(tmp_path))
    command = hook._build_spark_submit_command(job_script("reconcile"))
    joined = " ".join(command)
    assert MYSQL_SECRET not in joined and CH_SECRET not in joined
    return command, staged, hook


def _conf(command) -> dict:
    return dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")


def _after_application(command) -> list[str]:
    return command[command.index(job_script("reconcile")) + 1:]


def test_local_client_mode_keeps_the_spec_private_on_this_host(monkeypatch, tmp_path):
    command, staged, hook = _command(monkeypatch, tmp_path, "local")
    assert command[command.index("--master") + 1] == "local[2]" and "--deploy-mode" not in command
    assert command[command.index("--py-files") + 1] == str(tmp_path / "airflow_sync_provider.zip")
    assert _after_application(command) == ["--spec", str(tmp_path / "spec.json")]
    assert stat.S_IMODE(os.stat(tmp_path / "spec.json").st_mode) == 0o600
    assert read_spec(str(tmp_path / "spec.json")).source.password == MYSQL_SECRET  # read by the local driver only
    assert hook._env["SPARK_LOCAL_IP"] == "127.0.0.1" and hook._env["PYSPARK_PYTHON"] == sys.executable
    assert hook._env["MALLOC_ARENA_MAX"] == "2"  # the channels' memory stays bounded (core/submission.py)
    assert hook._env["OPENBLAS_NUM_THREADS"] == "1"  # no BLAS threads spinning in the job's processes


def test_a_local_master_runs_the_driver_in_python_without_spark_submit(monkeypatch, tmp_path):
    """No JVM before the job needs one: the script runs under this interpreter; a session it may
    build gets spark-submit's master, conf and py-files from $PYSPARK_SUBMIT_ARGS; the passwords
    stay in the 0600 spec, never in argv or the environment."""
    import shlex

    for conn_id, conn in CONNECTIONS.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_SPARK_{conn_id.upper()}", json.dumps(conn))
    operator = ReconcileOperator(task_id="t", load_key="k", spark_conn_id="spark_local",
                                 spark_conf={"spark.executor.memory": "2g"})
    (tmp_path / "a").mkdir()
    cmd, env, staged = operator.driver_command(_spec(), str(tmp_path / "a"))
    assert cmd == [sys.executable, job_script("reconcile"), "--spec", str(tmp_path / "a" / "spec.json")]
    assert env["MASTER"] == "local[2]" and env["MALLOC_ARENA_MAX"] == "2"
    submit = shlex.split(env["PYSPARK_SUBMIT_ARGS"])
    assert submit[:2] == ["--master", "local[2]"] and submit[-1] == "pyspark-shell"
    assert submit[submit.index("--py-files") + 1] == staged.py_files
    assert _conf(submit)["spark.executor.memory"] == "2g" and _conf(submit)["spark.ui.enabled"] == "false"
    everything = " ".join(cmd) + " ".join(env.values())
    assert MYSQL_SECRET not in everything and CH_SECRET not in everything
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "spec.json").st_mode) == 0o600
    # spark-submit when asked, and always for a cluster's master
    assert ReconcileOperator(task_id="u", load_key="k", spark_conn_id="spark_local",
                             use_spark_submit=True).driver_command(_spec(), str(tmp_path)) is None
    assert ReconcileOperator(task_id="v", load_key="k", spark_conn_id="spark_standalone").driver_command(
        _spec(), str(tmp_path)) is None


def test_jobs_that_compute_in_python_start_a_lean_driver_jvm(monkeypatch, tmp_path):
    """A full load's driver JVM only launches Python: C1 and the serial collector (half the CPU to
    start); reconciliation computes in Spark SQL and keeps the defaults; a user's conf wins."""
    from airflow_sync_provider.core.jobspec import FullLoadSpec
    from airflow_sync_provider.core.submission import LIGHT_DRIVER_JAVA_OPTIONS, prepare

    monkeypatch.setenv("AIRFLOW_SYNC_JVM_ARCHIVE_DIR", "")  # no class archive (the next test)
    load = FullLoadSpec(sources=one_server(_spec().source), target=_spec().target, source_database="d",
                        source_table="t", target_database="d", target_table="t")
    for name in ("load", "own", "reconcile"):
        (tmp_path / name).mkdir()
    command, _ = prepare(load, str(tmp_path / "load"), use_spark_submit=True)
    assert _conf(command)["spark.driver.extraJavaOptions"] == LIGHT_DRIVER_JAVA_OPTIONS
    command, _ = prepare(load, str(tmp_path / "own"), conf={"spark.driver.extraJavaOptions": "-Xmx2g"},
                         use_spark_submit=True)
    assert _conf(command)["spark.driver.extraJavaOptions"] == "-Xmx2g"
    command, _, _ = _command(monkeypatch, tmp_path / "reconcile", "local")
    assert "spark.driver.extraJavaOptions" not in _conf(command)


def test_a_local_driver_jvm_starts_from_the_hosts_class_archive_where_there_is_one(monkeypatch, tmp_path):
    """Every client-mode driver (a light one or not) reads this host's archive once it exists, named
    for its Java and Spark; none before, and none when the setting is empty."""
    from airflow_sync_provider.core import jvm_archive
    from airflow_sync_provider.core.jobspec import FullLoadSpec
    from airflow_sync_provider.core.submission import LIGHT_DRIVER_JAVA_OPTIONS, prepare

    monkeypatch.setenv(jvm_archive.DIR_ENV, str(tmp_path / "cache"))
    load = FullLoadSpec(sources=one_server(_spec().source), target=_spec().target, source_database="d",
                        source_table="t", target_database="d", target_table="t")
    (tmp_path / "before").mkdir()
    command, _ = prepare(load, str(tmp_path / "before"), use_spark_submit=True)
    assert _conf(command)["spark.driver.extraJavaOptions"] == LIGHT_DRIVER_JAVA_OPTIONS
    path = jvm_archive.archive_path()
    assert path.startswith(str(tmp_path / "cache")) and path.endswith(".jsa")
    os.makedirs(os.path.dirname(path))
    open(path, "wb").close()
    for name in ("load", "reconcile"):
        (tmp_path / name).mkdir()
    command, _ = prepare(load, str(tmp_path / "load"), use_spark_submit=True)
    options = _conf(command)["spark.driver.extraJavaOptions"]
    assert options == f"{LIGHT_DRIVER_JAVA_OPTIONS} -XX:SharedArchiveFile={path}"
    command, _, _ = _command(monkeypatch, tmp_path / "reconcile", "local")
    assert _conf(command)["spark.driver.extraJavaOptions"] == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv(jvm_archive.DIR_ENV, "")
    assert jvm_archive.archive_path() is None and jvm_archive.java_options() == ""


def test_the_package_zip_is_built_once_per_version_in_a_private_cache(monkeypatch, tmp_path):
    """Each job links the same zip (compiling it costs ~0.2 s); a cache directory others could
    write into is never used (its zip would run as this user's code)."""
    import tempfile
    import zipfile

    from airflow_sync_provider.core.submission import package_zip

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first, second = (package_zip(str(d)) for d in (tmp_path / "a", tmp_path / "b") if not d.mkdir())
    assert os.stat(first).st_ino == os.stat(second).st_ino
    assert "airflow_sync_provider/core/verify/rowhash.pyc" in zipfile.ZipFile(second).namelist()
    cache = tmp_path / f"airflow-sync-{os.getuid()}"
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    cache.chmod(0o777)
    (tmp_path / "c").mkdir()
    third = package_zip(str(tmp_path / "c"))
    assert os.stat(third).st_ino != os.stat(first).st_ino and os.stat(third).st_nlink == 1
    assert zipfile.ZipFile(third).namelist() == zipfile.ZipFile(first).namelist()


def test_standalone_client_mode_lets_executors_reach_the_driver(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    command, staged, hook = _command(monkeypatch, tmp_path, "standalone",
                                     spark_conf={"spark.driver.host": "airflow-worker-1"})
    assert command[command.index("--master") + 1] == "spark://10.1.2.3:7077" and "--deploy-mode" not in command
    assert "SPARK_LOCAL_IP" not in hook._env  # a loopback driver address would be unreachable from the workers
    assert _conf(command)["spark.driver.host"] == "airflow-worker-1"
    assert _after_application(command) == ["--spec", str(tmp_path / "spec.json")]


def test_yarn_cluster_mode_ships_the_spec_without_secrets(monkeypatch, tmp_path):
    command, staged, hook = _command(monkeypatch, tmp_path, "yarn_cluster")
    assert command[command.index("--master") + 1] == "yarn"
    assert command[command.index("--deploy-mode") + 1] == "cluster" and command[command.index("--queue") + 1] == "etl"
    assert command[command.index("--files") + 1] == str(tmp_path / "spec.json")
    assert _after_application(command) == ["--spec", "spec.json", "--secrets-from-env", "--result-key",
                                           staged.result_key]
    assert not any(k.startswith("spark.yarn.appMasterEnv") for k in _conf(command))  # nothing of this host's env
    shipped = json.loads((tmp_path / "spec.json").read_text())
    assert shipped["sources"][0]["endpoint"]["password"] == shipped["target"]["password"] == ""
    assert shipped["result_path"] == ""
    assert MYSQL_SECRET not in (tmp_path / "spec.json").read_text()


def test_kubernetes_cluster_mode_takes_the_passwords_from_a_secret(monkeypatch, tmp_path):
    command, staged, hook = _command(monkeypatch, tmp_path, "k8s_cluster", kubernetes_secret="sync-secrets",
                                     pyspark_python="/opt/venv/bin/python")
    assert command[command.index("--master") + 1] == "k8s://https://k8s.example:443"
    assert command[command.index("--deploy-mode") + 1] == "cluster"
    conf = _conf(command)
    assert conf["spark.kubernetes.namespace"] == "sync" and conf["spark.pyspark.python"] == "/opt/venv/bin/python"
    assert conf[f"spark.kubernetes.driver.secretKeyRef.{SECRET_ENV['source']}"] == "sync-secrets:mysql-password"
    assert conf[f"spark.kubernetes.driver.secretKeyRef.{SECRET_ENV['target']}"] == "sync-secrets:clickhouse-password"
    assert command[command.index("--files") + 1] == str(tmp_path / "spec.json")
    assert not any(k.startswith("spark.kubernetes.driverEnv") for k in conf)


@pytest.mark.parametrize("conn, master, deploy_mode", [
    (None, "yarn", None),  # no such connection: YARN, as the hook defaults
    ({"conn_type": "spark", "host": "local[2]"}, "local[2]", None),
    ({"conn_type": "spark", "host": "spark://10.1.2.3", "port": 7077}, "spark://10.1.2.3:7077", None),
    ("spark://10.1.2.3:7077?deploy-mode=client", "spark://10.1.2.3:7077", "client"),  # a URI: host and port apart
    ({"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}, "yarn", "cluster"),
    ({"conn_type": "spark", "host": "k8s://https://k8s.example:443", "extra": {"deploy-mode": "cluster"}},
     "k8s://https://k8s.example:443", "cluster"),
])
def test_the_deployment_is_what_the_spark_hook_resolved(monkeypatch, conn, master, deploy_mode):
    """``spark_deployment`` (what the operator stages for) is the Spark provider's own resolution,
    the master that hook puts on spark-submit's command line, for each form of connection."""
    from airflow_sync_provider.hooks.endpoints import spark_deployment

    monkeypatch.setattr(spark_submit_module, "kube_client", object(), raising=False)
    if conn is not None:
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_FORM", conn if isinstance(conn, str) else json.dumps(conn))
    assert spark_deployment("spark_form") == {"master": master, "deploy_mode": deploy_mode}
    command = spark_submit_module.SparkSubmitHook(conn_id="spark_form")._build_spark_submit_command("app.py")
    assert command[command.index("--master") + 1] == master


def test_standalone_cluster_mode_is_refused_for_python(tmp_path):
    with pytest.raises(ValueError, match="standalone cluster in client mode only"):
        stage(_spec(), str(tmp_path), "spark://h:7077", "cluster")


@pytest.mark.slow
def test_a_cluster_mode_driver_gets_its_passwords_from_the_environment(tmp_path, mysql_url, clickhouse_url, demo_db,
                                                                      spark):
    """What a YARN/Kubernetes driver does, run here: the staged spec (no passwords) in another
    working directory, the passwords from the environment, the result through the ledger."""
    from airflow_sync_provider.core.clickhouse.client import client
    from airflow_sync_provider.core.jobspec import FullLoadSpec
    from airflow_sync_provider.core.ledger import Ledger
    from airflow_sync_provider.core.submission import spark_env
    from airflow_sync_provider.spark.full_load import run_full_load

    source, target = MySQLEndpoint.from_url(mysql_url), ClickHouseEndpoint.from_url(clickhouse_url)
    run_full_load(FullLoadSpec(sources=one_server(source), target=target, source_database="demo",
                               source_table="customers", target_database="deploy", target_table="customers",
                               load_key="deploy.customers"), spark)
    staged_dir, driver_dir = tmp_path / "submitter", tmp_path / "driver"
    staged_dir.mkdir(mode=0o700)
    driver_dir.mkdir()
    staged = stage(ReconcileSpec(sources=one_server(source), target=target, load_key="deploy.customers", checksum=True),
                   str(staged_dir), "yarn", "cluster")
    (driver_dir / "spec.json").write_bytes((staged_dir / "spec.json").read_bytes())  # what --files does
    env = {k: v for k, v in {**os.environ, **spark_env()}.items() if k not in SECRET_ENV.values()}
    spark = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[1]",
             "--py-files", staged.py_files, job_script("reconcile"), *staged.application_args]
    missing = subprocess.run(spark, cwd=driver_dir, env=env, capture_output=True, text=True, timeout=300)
    assert missing.returncode != 0 and SECRET_ENV["source"] in missing.stdout + missing.stderr
    env |= {SECRET_ENV["source"]: source.password, SECRET_ENV["target"]: target.password}
    run = subprocess.run(spark, cwd=driver_dir, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    ch = client(target)
    result = Ledger(ch).job_result(staged.result_key)
    ch.close()
    assert result["status"] == "success" and result["verdict"] == "ok" and result["checksum"]


def test_a_source_group_ships_no_source_password_and_takes_each_from_its_own_variable(monkeypatch, tmp_path):
    """Cluster mode with sources=: every source's password (and client key) is left out of the
    staged spec and read from ``AIRFLOW_SYNC_MYSQL_PASSWORD_<NAME>`` by the driver."""
    from airflow_sync_provider.core.jobspec import FullLoadSpec
    from airflow_sync_provider.core.source.group import Source
    from airflow_sync_provider.core.specfile import read_spec
    from airflow_sync_provider.core.submission import secrets_from_env

    spec = FullLoadSpec(target=ClickHouseEndpoint(password="ch-pw"), source_database="", source_table="",
                        target_database="", target_table="", merge=Merge.of("an.orders"),
                        tableset=TableSet(select={"databases": ["shop_*"]}),
                        sources=[Source("eu-1", MySQLEndpoint(password="pw-eu-1")),
                                 Source("us.2", MySQLEndpoint(password="pw-us-2"))])
    staged = stage(spec, str(tmp_path), "yarn", "cluster", kubernetes_secret="sync")
    text = (tmp_path / "spec.json").read_text()
    assert "pw-eu-1" not in text and "pw-us-2" not in text and "ch-pw" not in text
    assert staged.conf[f"spark.kubernetes.driver.secretKeyRef.{SECRET_ENV['source']}_EU_1"] == \
        "sync:mysql-password-eu-1"
    shipped = read_spec(str(tmp_path / "spec.json"))
    monkeypatch.setenv(SECRET_ENV["target"], "ch-pw")
    monkeypatch.setenv(f"{SECRET_ENV['source']}_EU_1", "pw-eu-1")
    with pytest.raises(RuntimeError, match=f"{SECRET_ENV['source']}_US_2"):
        secrets_from_env(shipped)
    monkeypatch.setenv(f"{SECRET_ENV['source']}_US_2", "pw-us-2")
    secrets_from_env(shipped)
    assert [s.endpoint.password for s in shipped.sources] == ["pw-eu-1", "pw-us-2"]
