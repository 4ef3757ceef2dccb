"""Running DAGs with `airflow dags test` in tests (in a runner process per environment that pays
Airflow's start once: tests/dag_runner.py), and watching every process's command line."""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from devenv.airflow_env import REPO


class ArgvWatcher(threading.Thread):
    """Samples every process's command line (what `ps` shows) while a run is going on."""

    def __init__(self, secrets):
        super().__init__(daemon=True)
        self.secrets, self.seen, self.leaks, self.stop = secrets, 0, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "spark" in argv:
                    self.seen += 1
                self.leaks += [argv for s in self.secrets if s in argv]
            self.stop.wait(0.05)


class CliRunner:
    """One tests/dag_runner.py process for one environment: Airflow CLI commands run in it one
    after another, each returning what ``subprocess.run`` of ``airflow <args>`` would."""

    def __init__(self, env: dict):
        self.folder = tempfile.mkdtemp(prefix="airflow-sync-runs-")
        self.runs = 0
        self.process = subprocess.Popen([sys.executable, "-m", "tests.dag_runner"], env=env, cwd=REPO,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        self.runs += 1
        out = os.path.join(self.folder, f"{self.runs}.log")
        self.process.stdin.write(json.dumps({"args": args, "out": out}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        reply = self.process.stdout.readline() if ready else ""
        output = Path(out).read_text(errors="replace") if os.path.exists(out) else ""
        if not reply:
            self.close()
            if not ready:
                raise subprocess.TimeoutExpired(["airflow", *args], timeout, output=output)
            raise RuntimeError(f"the Airflow runner died running {args}: {output[-3000:]}")
        return subprocess.CompletedProcess(["airflow", *args], json.loads(reply)["returncode"], output, "")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


_runners: dict[tuple, CliRunner] = {}


def airflow_cli(env, *args, timeout: float = 900) -> subprocess.CompletedProcess:
    """``airflow <args>`` in ``env`` (a runner shared by every command of the same environment)."""
    key = tuple(sorted(env.items()))
    runner = _runners.get(key)
    if runner is None or runner.process.poll() is not None:
        runner = _runners[key] = CliRunner(dict(env))
    return runner.run(list(args), timeout)


@atexit.register
def close_runners() -> None:
    """Every runner ended (a test module's end: tests/conftest.py)."""
    while _runners:
        _runners.popitem()[1].close()


def run_dag(env, dag_id, dags_folder=None, *more):
    env = dict(env)
    if dags_folder:
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    return airflow_cli(env, "dags", "test", dag_id, *more)
