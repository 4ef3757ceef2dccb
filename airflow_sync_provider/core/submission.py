"""What a submission needs besides the submitter: the job scripts, the package zip, the result.

Airflow submits through SparkSubmitHook (operators/spark_job.py); the CLI, benchmarks and tests
use ``spark_submit`` here, which runs the same scripts with the same spec-file convention.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

import airflow_sync_provider
from airflow_sync_provider.core.jobspec import write_spec


def job_script(job: str) -> str:
    return str(resources.files("airflow_sync_provider.spark_jobs") / f"{job}.py")


def package_zip(directory: str) -> str:
    """Zip this package so executors on any cluster import the same code (``--py-files``)."""
    root = Path(airflow_sync_provider.__file__).parent
    path = os.path.join(directory, "airflow_sync_provider.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in root.rglob("*.py"):
            zf.write(file, Path("airflow_sync_provider") / file.relative_to(root))
    return path


def read_result(path: str) -> dict:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def spark_env(python: str | None = None) -> dict:
    """Environment for spark-submit: Python workers use ``python`` (default: this interpreter)."""
    python = python or sys.executable
    return {
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
        "PATH": os.pathsep.join([os.path.dirname(python), os.environ.get("PATH", "")]),
        "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
    }


def prepare(spec, workdir: str, master: str = "local[2]", conf: dict | None = None) -> list[str]:
    """Write the spec (0600) into ``workdir`` and return the spark-submit command for it."""
    spec.result_path = os.path.join(workdir, "result.json")
    spec_path = os.path.join(workdir, "spec.json")
    write_spec(spec, spec_path)
    cmd = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", master,
           "--py-files", package_zip(workdir)]
    for key, value in {"spark.ui.enabled": "false", "spark.log.level": "WARN", **(conf or {})}.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + [job_script(spec.job), "--spec", spec_path]


def spark_submit(spec, master: str = "local[2]", conf: dict | None = None, timeout: float | None = None,
                 log=None) -> dict:
    """spark-submit ``spec``'s job without Airflow; returns the job's result (status, error, …)."""
    with tempfile.TemporaryDirectory(prefix="airflow-sync-") as tmp:
        cmd = prepare(spec, tmp, master, conf)
        run = subprocess.run(cmd, env={**os.environ, **spark_env()}, stdout=log or subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=timeout)
        result = read_result(spec.result_path)
        if not result:
            tail = (run.stdout or "")[-3000:] if log is None else ""
            result = {"status": "failed", "error": f"spark-submit exited {run.returncode}: {tail}"}
        return result
