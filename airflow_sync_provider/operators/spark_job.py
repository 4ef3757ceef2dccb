"""Base operator: write a job spec, spark-submit ``spark_jobs/<job>.py``, read the result back."""

from __future__ import annotations

import json
import os
import tempfile
import time

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_sync_provider.assets import openlineage
from airflow_sync_provider.compat import AirflowException, AirflowFailException, Asset, BaseHook, BaseOperator
from airflow_sync_provider.core.clickhouse.client import client as clickhouse_client
from airflow_sync_provider.core.guard import descendants, end_processes, end_tree
from airflow_sync_provider.core.ledger import Ledger, TaskRef
from airflow_sync_provider.core.selection import TableSet
from airflow_sync_provider.core.specfile import public_dict
from airflow_sync_provider.core.submission import (
    Submission,
    job_script,
    python_driver,
    python_driver_command,
    read_result,
    run_driver,
    stage,
)
from airflow_sync_provider.hooks.endpoints import spark_deployment
from airflow_sync_provider.links import SyncViewLink
from airflow_sync_provider.stats import emit

DEFAULT_CONF = {"spark.ui.showConsoleProgress": "false", "spark.ui.enabled": "false", "spark.log.level": "WARN"}


def job_failure(job: str, result: dict, fallback: str) -> AirflowException:
    """The exception a failed job's task raises: its error, and whether Airflow should retry —
    not when the job says a retry will not help (core/failures.py), so the task fails at once."""
    error = result.get("error") or fallback
    kind = AirflowFailException if result.get("retry_helps") is False else AirflowException
    return kind(f"{job} job failed: {error}")


class SparkJobOperator(BaseOperator):
    """Submits one of this package's Spark jobs, in client or cluster deploy mode.

    Secrets never reach argv. Client mode (the driver runs here): the spec, with passwords, is a
    0600 file in a 0700 temporary directory that is removed afterwards; spark-submit gets only
    ``--spec <path>``. Cluster mode (YARN, Kubernetes: the driver runs on the cluster): the spec
    travels with ``--files`` without passwords, the driver takes them from its environment
    (``kubernetes_secret=`` on Kubernetes; the cluster's configuration on YARN; see
    core/submission.py) and reports its result to the ledger, where this operator reads it.
    Subclasses implement ``build_spec(context)`` and may override ``summarize(result)``.

    :param spark_conn_id: a ``spark`` connection; its host is the master (``local[*]``,
        ``spark://host:7077``, ``yarn``, ``k8s://https://…``), extra ``deploy-mode``.
    :param spark_conf: extra ``--conf`` entries (never put secrets here: they are on argv). On a
        cluster in client mode, executors must reach this host: set ``spark.driver.host`` if its
        name does not resolve there.
    :param pyspark_python: interpreter for Python workers; defaults to this one, which has the
        package installed (on a cluster it must exist on every worker).
    :param kubernetes_secret: Kubernetes cluster mode: the secret with keys ``mysql-password``
        and ``clickhouse-password`` that the driver's environment is filled from.
    :param use_spark_submit: on a local master the job's driver runs as a plain Python process
        (core/submission.py: no JVM unless the job needs executors, 2-5 s less per task); True
        submits it through spark-submit there too. Other masters always use spark-submit.
    :param failure_wait_seconds: how long the job waits, in all, for a server that does not
        answer (one wait for the whole job: core/failures.py) before it fails (default 40 s). A
        failure a retry cannot cure (access denied, an unknown table…) fails the task at once and
        without retries (``AirflowFailException``); any other is left to the task's ``retries``,
        and the retry resumes where the job stopped (docs/troubleshooting.md).
    :param hash_salt_conn_id: the Airflow connection whose password is the salt of the copies'
        ``hash`` transforms (docs/content.md); or
    :param hash_salt_env: the environment variable (of the worker) that holds it. The salt travels
        as the passwords do: never on argv, masked in the logged spec, XCom and the ledger.
    """

    job: str = ""
    ui_color = "#fde2b0"
    operator_extra_links = (SyncViewLink(),)

    def __init__(self, *, spark_conn_id: str = "spark_default", spark_conf: dict | None = None,
                 pyspark_python: str | None = None, kubernetes_secret: str | None = None,
                 use_spark_submit: bool = False, failure_wait_seconds: float | None = None,
                 hash_salt_conn_id: str | None = None, hash_salt_env: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.hash_salt_conn_id = hash_salt_conn_id
        self.hash_salt_env = hash_salt_env
        self.use_spark_submit = use_spark_submit
        self.failure_wait_seconds = failure_wait_seconds
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.pyspark_python = pyspark_python
        self.kubernetes_secret = kubernetes_secret

    def build_spec(self, context):
        raise NotImplementedError

    def tableset(self) -> TableSet:
        """The tables the operator was given (``select``, ``tables``, ``parallel_tables``, ``layout`` and
        the content settings ``transform``, ``row_filter``, ``on_delete``, ``history``), as a spec carries
        them."""
        content = {k: getattr(self, k, None) for k in ("transform", "row_filter", "on_delete", "history")}
        return TableSet(select=getattr(self, "select", None), tables=list(getattr(self, "tables", None) or []),
                        parallel=getattr(self, "parallel_tables", 2), layout=getattr(self, "layout", None),
                        content={k: v for k, v in content.items() if v} or None)

    def hash_salt(self) -> str:
        """The salt of hash transforms: the connection's password, or the variable's value."""
        if self.hash_salt_conn_id:
            salt = BaseHook.get_connection(self.hash_salt_conn_id).password or ""
            if not salt:
                raise AirflowFailException(f"hash_salt_conn_id={self.hash_salt_conn_id!r}: the connection has no "
                                           "password (it holds the hash salt)")
            return salt
        if self.hash_salt_env:
            if not os.environ.get(self.hash_salt_env):
                raise AirflowFailException(f"hash_salt_env={self.hash_salt_env!r}: the variable is not set on this "
                                           "worker (it holds the hash salt)")
            return os.environ[self.hash_salt_env]
        return ""

    def summarize(self, result: dict) -> dict:
        return result

    def sync_page(self, spec) -> str:
        """This task's page in the Sync view (links.py): the loads, report or pipeline it works on."""
        return ""

    def ledger_subject(self, spec) -> tuple[str, str] | None:
        """(kind, key) of what this task's job works on in the ledger (``ledger.TASK_LOAD``, …):
        recorded with the task instance as the job starts, so the Sync view links its rows here."""
        return None

    def metrics_baseline(self, spec):
        """What :meth:`job_metrics` compares the job's outcome with, read before the job runs."""
        return None

    def job_metrics(self, spec, result: dict | None, seconds: float, baseline) -> list:
        """The metrics of this try (core/metrics.py), sent after its job ended, failed ones too
        (``result`` None: the job wrote no success result)."""
        return []

    def lineage(self, spec, result: dict) -> tuple[list, list]:
        """The tables the run read and wrote: ([(namespace, name)], [(namespace, name, rows)])."""
        return [], []

    def declare_assets(self, inlets: list, outlets: list) -> None:
        """Inlets and outlets for the tables named when the DAG is parsed (airflow_sync_provider/
        assets.py), unless the DAG author gave their own."""
        if not self.inlets:
            self.inlets = [a for a in inlets if a is not None]
        if not self.outlets:
            self.outlets = [a for a in outlets if a is not None]

    def get_openlineage_facets_on_complete(self, task_instance):
        """OpenLineage: input MySQL tables, output ClickHouse tables with rows written."""
        inputs, outputs = getattr(self, "_lineage", ([], []))
        return openlineage(inputs, outputs)

    def submit_hook(self, spec, workdir: str) -> tuple[SparkSubmitHook, Submission]:
        """The hook that submits ``spec`` staged in ``workdir`` for the connection's deployment."""
        where = self._where()
        staged = stage(spec, workdir, where["master"], where["deploy_mode"], self.pyspark_python,
                       self.kubernetes_secret)
        hook = SparkSubmitHook(
            conn_id=self.spark_conn_id,
            conf={**DEFAULT_CONF, **staged.conf, **(self.spark_conf or {})},
            files=staged.files,
            py_files=staged.py_files,
            application_args=staged.application_args,
            name=f"airflow-sync-{self.job}-{self.task_id}",
            # client mode: spark-submit ships in the interpreter's bin directory (pip's pyspark);
            # cluster mode: the cluster's own environment (the hook would put these on argv)
            env_vars=staged.env_vars or None,
        )
        return hook, staged

    def _where(self) -> dict:
        return spark_deployment(self.spark_conn_id)  # master, deploy mode

    def driver_command(self, spec, workdir: str) -> tuple[list[str], dict, Submission] | None:
        """The Python driver's command for ``spec`` staged in ``workdir`` (a local master), else None."""
        where = self._where()
        if self.use_spark_submit or not python_driver(where["master"], where["deploy_mode"]):
            return None
        staged = stage(spec, workdir, where["master"], None, self.pyspark_python)
        cmd, env = python_driver_command(self.job, staged, where["master"],
                                         {**DEFAULT_CONF, **staged.conf, **(self.spark_conf or {})})
        return cmd, env, staged

    def execute(self, context):
        spec = self.build_spec(context)
        spec.hash_salt = self.hash_salt()
        if self.failure_wait_seconds is not None:
            spec.failure_wait_seconds = self.failure_wait_seconds
        self.sync_link = self.sync_page(spec)
        self.log.info("Job spec (secrets masked): %s", json.dumps(public_dict(spec), default=str))
        self._remember_task(spec, context)
        baseline = self._quietly("read the ledger before the job", self.metrics_baseline, spec)
        started, result = time.monotonic(), None
        try:
            result = self._run_job(spec)
        finally:
            done = result if result is not None and result.get("status") == "success" else None
            emit(self._quietly("gather metrics", self.job_metrics, spec, done, time.monotonic() - started, baseline)
                 or [])
        if result.get("status") != "success":
            raise job_failure(self.job, result, "it wrote no success result")
        self._lineage = self.lineage(spec, result)
        summary = self.summarize(result)
        for asset in self.outlets:  # what the downstream DAGs see on the asset event
            events = context.get("outlet_events") if hasattr(context, "get") else None
            if events is not None and isinstance(asset, Asset):
                events[asset].extra = {k: summary[k] for k in ("load_key", "rows", "verdict", "counts", "checkpoint")
                                       if k in summary}
        return summary

    def _run_job(self, spec) -> dict:
        with tempfile.TemporaryDirectory(prefix="airflow-sync-") as tmp:  # created 0700
            local = self.driver_command(spec, tmp)
            if local is not None:
                cmd, env, staged = local
                self.log.info("Running the %s job's driver in Python on %s (no spark-submit)", self.job,
                              env["MASTER"])
                code, _ = run_driver(cmd, env, self.log.info, started=lambda proc: setattr(self, "_driver", proc))
                if code:
                    raise job_failure(self.job, self._result(spec, staged), f"its driver exited {code}")
            else:
                hook, staged = self.submit_hook(spec, tmp)
                self._hook = hook
                try:
                    hook.submit(application=job_script(self.job))
                except AirflowException as exc:
                    raise job_failure(self.job, self._result(spec, staged), str(exc)) from None
            return self._result(spec, staged)

    def _remember_task(self, spec, context) -> None:
        """Record this task instance in the ledger as the one working on :meth:`ledger_subject`."""
        subject = self.ledger_subject(spec)
        ti = context.get("ti") if hasattr(context, "get") else None
        if subject is None or ti is None:
            return
        map_index = getattr(ti, "map_index", -1)
        task = TaskRef(ti.dag_id, ti.task_id, ti.run_id, -1 if map_index is None else map_index,
                       getattr(ti, "try_number", 1) or 1)
        self._quietly("record the task instance", lambda: self.with_ledger(spec, lambda led: led.write_task(*subject,
                                                                                                        task)))

    @staticmethod
    def with_ledger(spec, use):
        """``use(Ledger)`` over a client of the spec's target, closed afterwards."""
        ch = clickhouse_client(spec.target)
        try:
            return use(Ledger(ch, spec.ledger_database))
        finally:
            ch.close()

    def _quietly(self, what: str, call, *args):
        """Bookkeeping for the Sync view and metrics never fails a task: a failure is logged."""
        try:
            return call(*args)
        except Exception as exc:  # noqa: BLE001
            self.log.warning("Could not %s (the job is not affected): %s: %s", what, type(exc).__name__, exc)
            return None

    def on_kill(self) -> None:
        """The task was killed: so is the job's whole process tree — a Python driver with its
        reader processes, or spark-submit with the driver it started (a cluster-mode driver is
        stopped by the hook, through the cluster)."""
        driver = getattr(self, "_driver", None)
        if driver is not None and driver.poll() is None:
            end_tree(driver.pid)
        hook = getattr(self, "_hook", None)
        if hook is not None:  # the hook stops the application (YARN, Kubernetes); then whatever it left here
            submitted = getattr(hook, "_submit_sp", None)
            left = descendants(submitted.pid) if submitted is not None and submitted.poll() is None else []
            hook.on_kill()
            end_processes(left)

    @staticmethod
    def _result(spec, staged: Submission) -> dict:
        if staged.result_path:
            return read_result(staged.result_path)
        return SparkJobOperator.with_ledger(spec, lambda ledger: ledger.job_result(staged.result_key))
