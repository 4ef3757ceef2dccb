"""Base operator: write a job spec, spark-submit ``spark_jobs/<job>.py``, read the result back."""

from __future__ import annotations

import json
import os
import tempfile

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_sync_provider.compat import AirflowException, BaseOperator
from airflow_sync_provider.core.jobspec import public_dict, write_spec
from airflow_sync_provider.core.submission import job_script, package_zip, read_result, spark_env

DEFAULT_CONF = {"spark.ui.showConsoleProgress": "false", "spark.ui.enabled": "false", "spark.log.level": "WARN"}


class SparkJobOperator(BaseOperator):
    """Submits one of this package's Spark jobs.

    Secrets never reach argv: the spec (with passwords) is a 0600 file in a 0700 temporary
    directory that is removed afterwards; spark-submit gets only ``--spec <path>``.
    Subclasses implement ``build_spec(context)`` and may override ``summarize(result)``.

    :param spark_conn_id: a ``spark`` connection; its host is the master (``local[*]`` locally).
    :param spark_conf: extra ``--conf`` entries (never put secrets here: they are on argv).
    :param pyspark_python: interpreter for Python workers; defaults to this one, which has the
        package installed.
    """

    job: str = ""
    ui_color = "#fde2b0"

    def __init__(self, *, spark_conn_id: str = "spark_default", spark_conf: dict | None = None,
                 pyspark_python: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.pyspark_python = pyspark_python

    def build_spec(self, context):
        raise NotImplementedError

    def summarize(self, result: dict) -> dict:
        return result

    def execute(self, context):
        spec = self.build_spec(context)
        self.log.info("Job spec (secrets masked): %s", json.dumps(public_dict(spec), default=str))
        with tempfile.TemporaryDirectory(prefix="airflow-sync-") as tmp:  # created 0700
            spec.result_path = os.path.join(tmp, "result.json")
            spec_path = os.path.join(tmp, "spec.json")
            write_spec(spec, spec_path)
            hook = SparkSubmitHook(
                conn_id=self.spark_conn_id,
                conf={**DEFAULT_CONF, **(self.spark_conf or {})},
                py_files=package_zip(tmp),
                application_args=["--spec", spec_path],
                name=f"airflow-sync-{self.job}-{self.task_id}",
                # spark-submit ships in the interpreter's bin directory (pip's pyspark)
                env_vars=spark_env(self.pyspark_python),
            )
            try:
                hook.submit(application=job_script(self.job))
            except AirflowException as exc:
                error = read_result(spec.result_path).get("error")
                raise AirflowException(f"{self.job} job failed: {error or exc}") from None
            result = read_result(spec.result_path)
        if result.get("status") != "success":
            raise AirflowException(f"{self.job} job wrote no success result: {result}")
        return self.summarize(result)

