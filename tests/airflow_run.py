"""Running DAGs with `airflow dags test` in tests, and watching every process's command line."""

from __future__ import annotations

import os
import subprocess
import sys
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


def run_dag(env, dag_id, dags_folder=None):
    env = dict(env)
    if dags_folder:
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    return subprocess.run([sys.executable, "-m", "airflow", "dags", "test", dag_id], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=900)
