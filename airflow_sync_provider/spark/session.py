from __future__ import annotations

import os
import threading


def build_session(app_name: str):
    """The session spark-submit configured (master, conf); nothing is hard-coded here."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.appName(app_name).getOrCreate()


def _warm(_) -> None:
    import importlib

    for name in ("airflow_sync_provider.core.source.reader",  # connectorx, mysqlclient, pyarrow
                 "airflow_sync_provider.spark.shard_copy"):  # clickhouse-connect, the shard loop
        importlib.import_module(name)


class LazySession:
    """A SparkSession built only when a job needs executors, in the background if asked early.

    Building one costs seconds (the SparkContext, then the Python workers' start-up on the
    first task). A full load starts it while it plans, and never for a table small enough to
    copy in the driver; a CDC run at its first batch too large to write from the driver.
    """

    def __init__(self, app_name: str):
        self.app_name = app_name
        self._session = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Begin building the session (and warm the Python workers) without waiting."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._build, name="spark-session", daemon=True)
                self._thread.start()

    def _build(self) -> None:
        try:
            session = build_session(self.app_name)
            # start the Python workers (reused by the job's tasks) and load our modules in them
            context = session.sparkContext
            context.parallelize(range(context.defaultParallelism), context.defaultParallelism).foreach(_warm)
            self._session = session
        except BaseException as exc:  # re-raised by get()
            self._error = exc

    def get(self):
        self.start()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._session

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def ready(self) -> bool:
        """Built: get() returns at once."""
        return self._session is not None

    @property
    def local(self) -> bool:
        """A local master: executors would run on this machine (spark-submit tells its Python
        driver the master in $MASTER; known without starting anything)."""
        return os.environ.get("MASTER", "").startswith("local")

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join()
            if self._session is not None:
                self._session.stop()


class ReadySession(LazySession):
    """A session that already exists (a caller's, e.g. a test's or the reconcile job's)."""

    def __init__(self, spark):
        super().__init__("")
        self._session = spark

    def start(self) -> None:
        pass

    def get(self):
        return self._session

    @property
    def local(self) -> bool:  # no session at all (a caller copying in-process): the driver copies
        return self._session is None or self._session.sparkContext.master.startswith("local")

    def stop(self) -> None:
        pass  # not ours to stop


def lazy(spark) -> LazySession:
    return spark if isinstance(spark, LazySession) else ReadySession(spark)

