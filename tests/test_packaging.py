"""Provider registration and docker-compose.yaml (no Docker engine here: it is parsed, not run)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

import yaml

import airflow_sync_provider
from devenv.airflow_env import REPO


def test_provider_info_is_registered_and_lists_every_module():
    eps = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("airflow_sync_provider")]
    assert len(eps) == 1
    info = eps[0].load()()
    assert info["package-name"] == "airflow-sync-provider"
    assert info["versions"][0] == airflow_sync_provider.__version__
    import importlib
    for section in ("operators", "hooks", "sensors", "triggers"):
        for entry in info.get(section, []):
            for module in entry["python-modules"]:
                importlib.import_module(module)
    assert "plugins" not in info  # the Sync view comes through its entry point alone (below)


def test_the_sync_view_plugin_loads_once_whatever_lazy_discover_providers_says(tmp_path):
    """Registered in the ``airflow.plugins`` entry-point group, the plugin is loaded by Airflow's
    plugins manager with lazy provider discovery (Airflow's default) and without it, once, with no
    import error (named in the provider info as well, eager discovery would load it a second
    time and report "already registered")."""
    eps = [ep for ep in entry_points(group="airflow.plugins") if ep.value.startswith("airflow_sync_provider")]
    assert ([(ep.name, ep.value) for ep in eps]
            == [("airflow_sync", "airflow_sync_provider.plugins.sync_view:SyncViewPlugin")])
    probe = (
        "import json\n"
        "from airflow import plugins_manager, settings\n"
        "out = {}\n"
        "for lazy in (True, False):\n"
        "    settings.LAZY_LOAD_PROVIDERS = lazy\n"
        "    plugins_manager._get_plugins.cache_clear()\n"
        "    plugins, errors = plugins_manager._get_plugins()\n"
        "    out[str(lazy)] = {'names': [p.name for p in plugins],"
        " 'errors': {k: v for k, v in errors.items() if 'sync' in k}}\n"
        "print(json.dumps(out))\n")
    env = {"AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    # cwd: not the repository, whose egg-info (pip's editable install) would be a second distribution
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    for lazy in ("True", "False"):
        assert found[lazy]["names"].count("airflow_sync") == 1, found
        assert found[lazy]["errors"] == {}, found


def test_airflow_providers_list_shows_the_package(tmp_path):
    env = {"AIRFLOW_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    out = subprocess.run([sys.executable, "-m", "airflow", "providers", "list"], env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "airflow-sync-provider" in out.stdout


def test_docker_compose_services_and_settings():
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert {"mysql", "clickhouse", "spark-master", "spark-worker", "airflow"} <= services.keys()
    mysql = services["mysql"]
    assert mysql["image"] == "mysql:8.4"
    flags = set(mysql["command"])
    for flag in ("--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL"):
        assert flag in flags
    assert any(f.startswith("--log-bin") for f in flags) and any(f.startswith("--server-id=") for f in flags)
    image, tag = services["clickhouse"]["image"].split(":")
    assert image == "clickhouse/clickhouse-server"
    major, minor = (int(x) for x in tag.split(".")[:2])
    assert minor in (3, 8) and major >= 25  # ClickHouse LTS releases are the .3 and .8 lines
    assert "Master" in " ".join(services["spark-master"]["command"])
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    airflow = services["airflow"]
    assert "standalone" in airflow["command"]
    assert any(v.startswith("./dags:") for v in airflow["volumes"])
    dockerfile = (REPO / airflow["build"]["dockerfile"]).read_text()
    assert "pip install" in dockerfile and "/opt/airflow-sync" in dockerfile
    assert (REPO / airflow["build"]["context"] / "pyproject.toml").exists()


def test_docker_compose_spark_settings_are_what_the_cluster_fixture_needed():
    """devenv/spark_cluster.py showed what a client-mode driver on another host needs; the
    compose stack must provide the same: a driver address the executors resolve (not loopback),
    the master where the connection points, databases by reachable names, one image (interpreter
    and package) for the driver and the executors."""
    services = yaml.safe_load((REPO / "docker-compose.yaml").read_text())["services"]
    airflow, master, worker = services["airflow"], services["spark-master"], services["spark-worker"]
    env = airflow["environment"]
    assert env["SPARK_LOCAL_HOSTNAME"] == airflow["hostname"]  # executors connect back to this name
    assert env.get("SPARK_LOCAL_IP", "") not in ("127.0.0.1", "localhost")
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert f"{spark['host']}:{spark['port']}" == f"spark://{master['hostname']}:7077"
    assert master["command"][master["command"].index("--host") + 1] == master["hostname"]
    assert f"spark://{master['hostname']}:7077" in worker["command"]
    assert worker["environment"]["SPARK_LOCAL_HOSTNAME"] == worker["hostname"]  # the driver reaches executors
    for name in ("AIRFLOW_CONN_SYNC_MYSQL", "AIRFLOW_CONN_SYNC_CLICKHOUSE"):
        host = json.loads(env[name])["host"]
        assert host in services and host not in ("localhost", "127.0.0.1")  # executors connect to these too
    assert master["image"] == worker["image"] == airflow["image"]  # same Python path, same package


def test_every_package_of_the_tree_ships():
    """pyproject.toml lists the packages setuptools installs: a package folder missing from the
    list works in the editable checkout and is absent from a wheel (a Docker image, a worker)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    root = REPO / "airflow_sync_provider"
    found = {".".join(p.parent.relative_to(REPO).parts) for p in root.rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from pyproject.toml's [tool.setuptools] list: {found - listed}"
