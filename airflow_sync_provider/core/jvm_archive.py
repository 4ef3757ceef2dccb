"""Class-data sharing for a local driver's JVM: the ~10,000 classes a Spark driver loads at its
start, read from one archive instead of from Spark's jars.

A driver on this host (a local master, or client mode) starts its JVM whenever a job needs Spark:
about 9 s before its first task on this 2-core machine, about 5 s with the archive (measured with
a session and one count, 2026-11-30). The archive belongs to one Java and one Spark installation
(its name says which), is made once per host by ``python -m airflow_sync_provider.core.jvm_archive``
(``devenv/setup.sh`` runs it; a deployment runs it where its drivers run), and is used only where it
exists. A JVM that cannot use it (another Java, an extra class path) says so in one warning line and
starts as it would without it. ``AIRFLOW_SYNC_JVM_ARCHIVE_DIR`` moves it; empty turns it off.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile

DIR_ENV = "AIRFLOW_SYNC_JVM_ARCHIVE_DIR"


def _directory() -> str:
    default = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                           "airflow-sync-provider")
    return os.environ.get(DIR_ENV, default)


def archive_path() -> str | None:
    """Where this host's archive for its Java and Spark is (or goes); None: turned off, or no Java."""
    directory = _directory()
    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) \
        if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not directory or not java:
        return None
    # found, not imported: a submitting Airflow task asks this for every job it stages
    found = importlib.util.find_spec("pyspark")
    if found is None or not found.submodule_search_locations:
        return None
    jars = sorted(glob.glob(os.path.join(found.submodule_search_locations[0], "jars", "*.jar")))
    java = os.path.realpath(java)
    text = "\n".join([java, str(os.stat(java).st_mtime_ns), importlib.metadata.version("pyspark"),
                      *map(os.path.basename, jars)])
    return os.path.join(directory, f"spark-driver-{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsa")


def java_options() -> str:
    """The driver JVM's option that reads the archive, or "" when there is none."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path and os.path.isfile(path) else ""


def build(line=print) -> str | None:
    """Make the archive unless it exists: a driver starts a session and runs one task, and its JVM
    writes the classes it loaded as it exits (spark-submit is that JVM, so they are all written when
    it returns); the archive then replaces any older one at once (os.replace)."""
    path = archive_path()
    if path is None or os.path.isfile(path):
        return path
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    part = f"{path}.{os.getpid()}.part"
    with tempfile.TemporaryDirectory(prefix="airflow-sync-jvm-") as tmp:
        script = os.path.join(tmp, "start.py")
        with open(script, "w") as out:
            out.write("from pyspark.sql import SparkSession\n"
                      "SparkSession.builder.getOrCreate().range(10).count()\n")
        cmd = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[1]",
               "--conf", "spark.ui.enabled=false",
               "--conf", f"spark.driver.extraJavaOptions=-XX:ArchiveClassesAtExit={part}", script]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    if done.returncode or not os.path.isfile(part):
        if os.path.exists(part):
            os.remove(part)
        line(f"no JVM class archive (spark-submit exited {done.returncode}): {done.stderr[-500:]}")
        return None
    os.replace(part, path)
    line(f"JVM class archive for local Spark drivers: {path} ({os.path.getsize(path) / 2**20:.0f} MiB)")
    return path


if __name__ == "__main__":
    build()
