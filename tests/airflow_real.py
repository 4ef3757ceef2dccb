"""A real Airflow for tests: scheduler (LocalExecutor), DAG processor, triggerer and API server
as separate processes, driven through the REST API (v2) with a JWT as the UI gets one.

``airflow dags test`` runs tasks and deferrable triggers inline in one process; here a task runs
in a LocalExecutor worker that talks to the API server's execution API, a deferred task's
trigger is serialized into the metadata database and re-created in the triggerer, and a
backfill's runs are scheduled side by side.

Metadata database: a PostgreSQL of its own (devenv/postgres.py). SQLite does not support the
LocalExecutor's concurrent writers, and Airflow 3.3 does not run on MariaDB (tried: the schema
migrates, but the scheduler's asset clean-up sends ``WITH … DELETE``, which MariaDB rejects,
and the scheduler exits).

Connections come from ``AIRFLOW_CONN_*`` environment variables (devenv/airflow_env.py), the
admin password from a 0600 file: nothing secret is on a command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from devenv.airflow_env import REPO, airflow_env
from devenv.mariadb import free_port
from devenv.postgres import PostgreSQL

COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")
# how often a wait asks the API again: a state change is seen within half a second (a call costs ~10 ms)
POLL = 0.5
ADMIN = "admin"


class ApiError(RuntimeError):
    pass


class StatsdListener:
    """A StatsD server on loopback (UDP) that keeps every metric line it receives."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:  # closed
                return
            with self._lock:
                self.lines.extend(line for line in data.decode(errors="replace").split("\n") if line)

    def received(self, name: str, kind: str, since: int = 0) -> list[float]:
        """Values of ``name`` (prefix included) of ``kind`` (``g``, ``c``, ``ms``) received after
        the ``since``-th line (:meth:`mark`)."""
        with self._lock:
            lines = self.lines[since:]
        out = []
        for line in lines:
            stat, _, rest = line.partition(":")
            value, _, kind_and_rate = rest.partition("|")
            if stat == name and kind_and_rate.split("|")[0] == kind:
                out.append(float(value))
        return out

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)

    def wait_for(self, name: str, kind: str, accept=lambda value: True, since: int = 0, timeout: float = 300,
                 check=None) -> float:
        """The first value of ``name`` received after ``since`` that ``accept`` takes."""
        deadline = time.monotonic() + timeout
        while True:
            found = [v for v in self.received(name, kind, since) if accept(v)]
            if found:
                return found[0]
            if time.monotonic() > deadline:
                seen = sorted({line.split(":")[0] for line in self.lines if "sync" in line})
                raise TimeoutError(f"no {name}|{kind} accepted in {timeout:.0f} s; sync metrics seen: {seen}")
            if check is not None:
                check()
            time.sleep(0.5)

    def close(self):
        self.sock.close()


class RealAirflow:
    """Start with :meth:`start` (or as a context manager); :meth:`api` calls the REST API."""

    def __init__(self, home: Path, mysql_url: str, clickhouse_url: str, dags_folder: Path = REPO / "dags",
                 parallelism: int = 4, statsd_port: int | None = None, hold_dir: Path | None = None,
                 shards: dict | None = None):
        self.shards = shards or {}  # a source group's servers: name → URL (connections sync_shard_<name>)
        self.home, self.dags_folder, self.parallelism = Path(home), Path(dags_folder), parallelism
        self.mysql_url, self.clickhouse_url = mysql_url, clickhouse_url
        self.statsd_port, self.hold_dir = statsd_port, hold_dir
        self.meta: PostgreSQL | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._password = secrets.token_urlsafe(16)
        self._token: str | None = None
        self.env: dict = {}
        self.timings: dict[str, float] = {}

    # -- start and stop ---------------------------------------------------------------------------
    def _environment(self) -> dict:
        passwords = self.home / "passwords.json"
        passwords.write_text(json.dumps({ADMIN: self._password}))
        passwords.chmod(0o600)
        env = airflow_env(self.home, self.mysql_url, self.clickhouse_url, self.shards)
        # as a plain install: the package from site-packages, not the repository (whose egg-info,
        # from pip's editable install, would be a second distribution with the same entry points)
        env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                            if p and Path(p).resolve() != REPO)
        env.update({
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.meta.url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.base,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),  # the same in every component
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "600",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            # a scheduler loop that found nothing to do looks again after 0.2 s, not 1 s: each of a
            # run's task transitions (queued, started, ended, the next one scheduled) waits for one
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__SYNC__CLICKHOUSE_CONN_ID": "sync_clickhouse",  # the Sync view's ledger
            # nothing else: [core] lazy_discover_providers stays Airflow's default (the plugin
            # comes through its entry point)
        })
        if self.statsd_port:  # Airflow's metrics (ours among them) to a listener of the test's
            env.update({"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                        "AIRFLOW__METRICS__STATSD_PORT": str(self.statsd_port),
                        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"})
        if self.hold_dir:  # tests hold jobs at core/crash_points.py's hold points
            env["AIRFLOW_SYNC_HOLD_DIR"] = str(self.hold_dir)
        return env

    def start(self, timeout: float = 240) -> "RealAirflow":
        started = time.monotonic()
        self.home.mkdir(parents=True, exist_ok=True)
        self.meta = PostgreSQL().start()
        self.env = self._environment()
        # cwd: Airflow's home, not the repository (see _environment)
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.env, cwd=self.home, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        self.timings["migrate"] = time.monotonic() - started
        for component in COMPONENTS:
            log = open(self.home / f"{component}.log", "wb")  # noqa: SIM115 - kept open by the process
            self.procs[component] = subprocess.Popen([sys.executable, "-m", "airflow", component], env=self.env,
                                                     cwd=self.home, stdout=log, stderr=subprocess.STDOUT,
                                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                health = self.api("GET", "/api/v2/monitor/health", auth=False)
                if all(health.get(c, {}).get("status") == "healthy"
                       for c in ("metadatabase", "scheduler", "triggerer", "dag_processor")):
                    break
            except (OSError, ApiError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Airflow did not become healthy in {timeout:.0f} s; logs in {self.home}")
            time.sleep(POLL)
        self.timings["healthy"] = time.monotonic() - started
        return self

    def _check_alive(self) -> None:
        for component, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.home / f"{component}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"airflow {component} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        """The deployment is thrown away: each component's process group (what it started too:
        workers, tasks, spark-submit) killed at once. A graceful shutdown of the scheduler,
        triggerer and API server took seconds each and tests nothing here."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        self.procs.clear()
        if self.meta is not None:
            self.meta.stop()
            self.meta = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- the REST API -----------------------------------------------------------------------------
    def token(self) -> str:
        """A JWT from the simple auth manager's login endpoint, as the UI's login form gets one."""
        if self._token is None:
            self._token = self.api("POST", "/auth/token", {"username": ADMIN, "password": self._password},
                                   auth=False)["access_token"]
        return self._token

    def sign_in(self, browser) -> None:
        """Sign ``browser`` (tests/chromium.py) in to Airflow's UI as its login form leaves it: the
        JWT in the ``_token`` cookie (auth managers' COOKIE_NAME_JWT_TOKEN; HttpOnly, SameSite=Lax)."""
        browser.set_cookie(self.base + "/", "_token", self.token())

    def api(self, method: str, path: str, body: dict | None = None, auth: bool = True, raw: bool = False):
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(f"{method} {path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:2000]}") from exc
        if raw:
            return payload.decode(errors="replace")
        return json.loads(payload) if payload else None

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> dict:
        """The DAG once the DAG processor has parsed it, unpaused (a paused DAG's tasks are not queued)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.api("GET", f"/api/v2/dags/{dag_id}")
                return self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
            except ApiError:
                if time.monotonic() > deadline:
                    raise
            self._check_alive()
            time.sleep(POLL)

    def wait_for_defer_exit(self, dag_id: str, run_id: str, task_id: str, timeout: float = 300) -> None:
        """Wait until the scheduler has taken in the executor's report of a deferred task's worker
        exit (its "TaskInstance Finished … state=deferred" line). A deferred task released before
        that races Airflow 3.3's scheduler: when the trigger fires first and the resumed attempt
        is already queued or running, the stale report of the exit marks it failed ("state
        mismatch", apache/airflow#71580, #72716). A test releases a deferred task only after this.

        The scheduler may also drop the report: it reads the task instances of a batch of events
        ``FOR UPDATE SKIP LOCKED`` (scheduler_job_runner.process_executor_events), so a row another
        component holds at that moment (the triggerer taking the trigger) is skipped and its event
        discarded with the batch — no "Finished" line ever comes. The batch is handled within
        milliseconds of its "Received executor event" line, so a few seconds after that line
        without the other, the report is gone and cannot race anything."""
        finished = re.compile(rf"TaskInstance Finished: dag_id={re.escape(dag_id)}, task_id={re.escape(task_id)}, "
                              rf"run_id={re.escape(run_id)}, .*?state=deferred, ")
        received = re.compile(rf"Received executor event with state \w+ for task instance TaskInstanceKey\("
                              rf"dag_id='{re.escape(dag_id)}', task_id='{re.escape(task_id)}', "
                              rf"run_id='{re.escape(run_id)}'")
        log = self.home / "scheduler.log"
        deadline, seen = time.monotonic() + timeout, None
        while True:
            text = log.read_text(errors="replace")
            if finished.search(text):
                return
            if seen is None and received.search(text):
                seen = time.monotonic()
            if seen is not None and time.monotonic() - seen > 3:
                return  # handled without a line: dropped (see above)
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler never took in the deferral of {dag_id}.{task_id} {run_id}")
            self._check_alive()
            time.sleep(0.5)

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        run = self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def runs(self, dag_id: str) -> list[dict]:
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=id")["dag_runs"]

    def wait_for_runs(self, dag_id: str, run_ids: list[str], timeout: float = 600) -> dict[str, str]:
        """Wait until every run ended; returns {run_id: state}."""
        deadline = time.monotonic() + timeout
        while True:
            states = {r["dag_run_id"]: r["state"] for r in self.runs(dag_id) if r["dag_run_id"] in run_ids}
            if len(states) == len(run_ids) and all(s in ("success", "failed") for s in states.values()):
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id} runs still {states} after {timeout:.0f} s; logs in {self.home}")
            self._check_alive()
            time.sleep(POLL)

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict]:
        tis = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]
        return {ti["task_id"]: ti for ti in tis}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        entry = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
                                "?deserialize=true")
        return entry["value"]

    def browse(self, path: str, png: Path, width: int = 1280, height: int = 1400) -> dict:
        """A page of the API server as headless Chromium renders it, signed in (the bearer token
        goes as a request header over the DevTools protocol: on no command line); a screenshot of
        it to ``png``. Returns the browser's navigation timing (tests/chromium.py)."""
        from tests.chromium import Chromium

        with Chromium(self.home / "chromium", width, height) as browser:
            timing = browser.open(self.base + path, {"Authorization": f"Bearer {self.token()}"})
            browser.screenshot(png)
        return timing

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
                               "?full_content=true", raw=True)
