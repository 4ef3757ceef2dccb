"""What a submission needs besides the submitter: the job scripts, the package zip, the spec
and where the result comes back, for each way Spark can run the driver.

* **client mode** (``local[*]``, ``spark://`` standalone, YARN/Kubernetes client): the driver
  runs where spark-submit runs. The spec, passwords included, is a 0600 file in a 0700
  directory; the job writes its result next to it.
* **cluster mode** (YARN, Kubernetes): the driver runs on the cluster and cannot read files on
  the submitting host. The spec travels with the submission (``--files``) *without* passwords;
  the driver reads them from its environment, which the cluster sets (``SECRET_ENV``: on
  Kubernetes from a secret, ``spark.kubernetes.driver.secretKeyRef``; on YARN from the
  cluster's own configuration), and writes its result to the ledger on ClickHouse under a key
  the submitter then reads. A client certificate's private key (``KEY_ENV``) travels the same
  way; the certificates themselves (not secret) stay in the spec. Nothing secret is on any
  command line or in a staged file.

On a **local master** the job's script runs as a plain Python process instead (``python_driver``):
every job there copies, checksums and diffs in the driver's threads (spark/channels.py) and never
needs the JVM that spark-submit starts first (2-5 s of a small table's task). If a job does ask
for a SparkSession (``driver_copy_rows=0``), pyspark starts it through spark-submit with the same
master, conf and py-files, taken from ``$PYSPARK_SUBMIT_ARGS``.

Airflow submits through SparkSubmitHook (operators/spark_job.py) or runs the Python driver
itself; the CLI, benchmarks and tests use ``spark_submit`` here, with the same conventions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import marshal
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import airflow_sync_provider
from airflow_sync_provider.core import jvm_archive
from airflow_sync_provider.core.guard import submitter_env
from airflow_sync_provider.core.specfile import spec_to_dict, write_private_json, write_spec
from airflow_sync_provider.core.tls import private_dir

# Where a cluster-mode driver finds the passwords (environment variables the cluster sets).
SECRET_ENV = {"source": "AIRFLOW_SYNC_MYSQL_PASSWORD", "target": "AIRFLOW_SYNC_CLICKHOUSE_PASSWORD"}
# ... and the salt of hash transforms (core/content/transforms.py), when the tables have any
SALT_ENV, K8S_SALT_KEY = "AIRFLOW_SYNC_HASH_SALT", "hash-salt"
# The keys of a Kubernetes secret holding them (``kubernetes_secret=`` names the secret).
K8S_SECRET_KEYS = {"source": "mysql-password", "target": "clickhouse-password"}
# An endpoint's client-certificate private key, when it has a client certificate: (the
# certificate's field, the key's field, the variable, the Kubernetes secret's key).
KEY_ENV = {"source": ("ssl_cert", "ssl_key", "AIRFLOW_SYNC_MYSQL_SSL_KEY", "mysql-ssl-key"),
           "target": ("client_cert", "client_cert_key", "AIRFLOW_SYNC_CLICKHOUSE_TLS_KEY", "clickhouse-tls-key")}


def job_script(job: str) -> str:
    return str(resources.files("airflow_sync_provider.spark_jobs") / f"{job}.py")


def package_zip(directory: str) -> str:
    """Zip this package so executors on any cluster import the same code (``--py-files``), as
    ``directory/airflow_sync_provider.zip``.

    Each module's bytecode goes along (``mod.pyc`` next to ``mod.py``, which zipimport uses when
    its recorded source time matches): a zip import would otherwise compile every module in
    every Python worker. Workers on another Python version ignore it and compile. Compiling
    costs ~0.2 s, so the zip is built once per version of the package's files and linked into
    ``directory`` from a private cache."""
    root = Path(airflow_sync_provider.__file__).parent
    files = sorted(root.rglob("*.py"))
    path = os.path.join(directory, "airflow_sync_provider.zip")
    cache = private_dir()
    if cache is None:
        _write_zip(path, root, files)
        return path
    stats = [(str(f.relative_to(root)), st.st_mtime_ns, st.st_size) for f in files for st in (f.stat(),)]
    fingerprint = hashlib.sha256(repr((stats, importlib.util.MAGIC_NUMBER)).encode()).hexdigest()[:20]
    cached = cache / f"package-{fingerprint}.zip"
    if not cached.exists():
        partial = cache / f"{cached.name}.{uuid.uuid4().hex}"
        _write_zip(str(partial), root, files)
        os.replace(partial, cached)  # same content under one name: racing writers are harmless
    try:
        os.link(cached, path)
    except OSError:
        shutil.copyfile(cached, path)
    return path


def _write_zip(path: str, root: Path, files: list[Path]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in files:
            name = str(Path("airflow_sync_provider") / file.relative_to(root))
            source = file.read_bytes()
            stamp = time.localtime(int(file.stat().st_mtime) & ~1)[:6]  # zip times have 2-second steps
            zf.writestr(zipfile.ZipInfo(name, stamp), source, zipfile.ZIP_DEFLATED)
            code = compile(source, name, "exec", dont_inherit=True)
            header = (importlib.util.MAGIC_NUMBER
                      + struct.pack("<III", 0, int(time.mktime(stamp + (0, 0, -1))) & 0xFFFFFFFF,
                                    len(source) & 0xFFFFFFFF))
            zf.writestr(zipfile.ZipInfo(name[:-3] + ".pyc", stamp), header + marshal.dumps(code), zipfile.ZIP_DEFLATED)


def read_result(path: str) -> dict:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def spark_env(python: str | None = None, master: str = "local") -> dict:
    """Environment for a client-mode spark-submit: Python workers use ``python`` (default: this
    interpreter). Only a local master is pinned to the loopback address: a cluster's executors
    must reach the driver, which then binds the host's address (or ``SPARK_LOCAL_IP`` /
    ``spark.driver.host`` as the deployment sets them). The driver is told who submitted it
    (core/guard.py): it ends when this process does."""
    python = python or sys.executable
    env = {
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
        "PATH": os.pathsep.join([os.path.dirname(python), os.environ.get("PATH", "")]),
        # connectorx decodes on threads of its own, each given a glibc malloc arena of its own (up
        # to 8 per core): freed Arrow buffers stay scattered over them. Two arenas: a 10M-row
        # load's driver peaked at 356 MiB instead of 399-439 (1M rows: 277 instead of 309), same CPU.
        "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2"),
        # numpy (imported by clickhouse-connect) starts OpenBLAS's threads, one per core, which spin
        # for a while though a job does no linear algebra: 0.09 CPU-s in every driver, reader
        # process and local Python worker. One thread has none to spin.
        "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1"),
        **submitter_env(),
    }
    if master.startswith("local"):
        env["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
    elif os.environ.get("SPARK_LOCAL_IP"):
        env["SPARK_LOCAL_IP"] = os.environ["SPARK_LOCAL_IP"]
    return env


@dataclass
class Submission:
    """What spark-submit gets for one job: everything but the master and the application."""

    application_args: list[str]
    files: str | None = None
    py_files: str | None = None
    env_vars: dict = field(default_factory=dict)
    conf: dict = field(default_factory=dict)
    result_path: str = ""  # client mode: the job writes its result here
    result_key: str = ""  # cluster mode: the job writes its result to the ledger under this key


# Jobs whose driver JVM only launches Python and schedules a few tasks (the rows flow through
# Python channels and lanes): C1-compiled and with the serial collector it starts on about half
# the CPU (a spark-submit running nothing: 4.0 -> 2.2 CPU seconds, 2.5 -> 1.9 s wall). Jobs that
# compute in Spark SQL (reconcile, snapshot diff) keep the JVM's defaults.
LIGHT_DRIVER_JOBS = ("full_load", "cdc_bootstrap", "cdc_apply")
LIGHT_DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def driver_conf(job: str) -> dict:
    """``--conf`` for a client-mode driver of ``job`` (a caller's own conf overrides it): the light
    JVM for the jobs above, and this host's class archive wherever there is one (core/jvm_archive.py)."""
    options = " ".join(o for o in (LIGHT_DRIVER_JAVA_OPTIONS if job in LIGHT_DRIVER_JOBS else "",
                                   jvm_archive.java_options()) if o)
    return {"spark.driver.extraJavaOptions": options} if options else {}


def is_cluster(deploy_mode: str | None) -> bool:
    return (deploy_mode or "client") == "cluster"


def stage(spec, workdir: str, master: str, deploy_mode: str | None = None, pyspark_python: str | None = None,
          kubernetes_secret: str | None = None) -> Submission:
    """Write the spec into ``workdir`` (created 0700) for ``master`` / ``deploy_mode``."""
    py_files = package_zip(workdir)
    spec_path = os.path.join(workdir, "spec.json")
    if not is_cluster(deploy_mode):
        spec.result_path = os.path.join(workdir, "result.json")
        # 0600, passwords included: read by the local driver only. The hash salt stays out of every
        # file: the driver's environment carries it (SALT_ENV), as a cluster's does
        salt, spec.hash_salt = spec.hash_salt, ""
        try:
            write_spec(spec, spec_path)
        finally:
            spec.hash_salt = salt
        env = {**spark_env(pyspark_python, master), **({SALT_ENV: salt} if salt else {})}
        return Submission(["--spec", spec_path], py_files=py_files, env_vars=env, conf=driver_conf(spec.job),
                          result_path=spec.result_path)
    if master.startswith(("local", "spark://")):
        raise ValueError(f"cluster deploy mode needs YARN or Kubernetes, not {master!r}: Spark runs Python "
                         "drivers of a standalone cluster in client mode only")
    spec.result_path = ""
    data = spec_to_dict(spec)
    secrets = {}  # variable -> the Kubernetes secret's key
    for side, endpoint, suffix in _endpoints(data):
        endpoint["password"] = ""  # the cluster supplies it (SECRET_ENV)
        secrets[SECRET_ENV[side] + suffix] = K8S_SECRET_KEYS[side] + suffix.lower().replace("_", "-")
        cert, key_field, key_variable, k8s_key = KEY_ENV[side]
        if endpoint.get(cert):
            endpoint[key_field] = ""  # likewise (KEY_ENV)
            secrets[key_variable + suffix] = k8s_key + suffix.lower().replace("_", "-")
    if data.get("hash_salt"):
        data["hash_salt"] = ""  # likewise (SALT_ENV)
        secrets[SALT_ENV] = K8S_SALT_KEY
    write_private_json(spec_path, data)
    os.chmod(spec_path, 0o644)  # no secret inside; the cluster's staging copies it
    key = uuid.uuid4().hex
    conf = {"spark.pyspark.python": pyspark_python} if pyspark_python else {}
    if kubernetes_secret:
        for variable, k8s_key in secrets.items():
            conf[f"spark.kubernetes.driver.secretKeyRef.{variable}"] = f"{kubernetes_secret}:{k8s_key}"
    return Submission(["--spec", "spec.json", "--secrets-from-env", "--result-key", key], files=spec_path,
                      py_files=py_files, conf=conf, result_key=key)


def _endpoints(data: dict):
    """(side, endpoint dict, variable suffix) of a spec dict's endpoints: its target and its
    sources (a group's: ``_<NAME>``, a variable per source)."""
    if data.get("target"):
        yield "target", data["target"], ""
    for source in data.get("sources") or []:
        yield "source", source["endpoint"], _suffix(source["name"])


def _suffix(name: str) -> str:
    """A source's variables' suffix: ``_<NAME>`` for a group's named source, none for a job's one server."""
    return "_" + re.sub(r"[^A-Z0-9]", "_", name.upper()) if name else ""


def secrets_from_env(spec) -> None:
    """A cluster-mode driver: fill the spec's passwords (and client-certificate keys) from the
    environment the cluster set (a source group's sources: ``AIRFLOW_SYNC_MYSQL_PASSWORD_<NAME>``);
    every variable missing is named at once."""
    missing = []

    def filled(side: str, endpoint, suffix: str):
        cert, key_field, key_variable, _ = KEY_ENV[side]
        wanted = {"password": (SECRET_ENV[side] + suffix, "password")}
        if getattr(endpoint, cert):
            wanted[key_field] = (key_variable + suffix, "client certificate's private key")
        missing.extend(f"${env} (the {side}'s {what})" for env, what in wanted.values() if env not in os.environ)
        return dataclasses.replace(endpoint, **{name: os.environ.get(env, "") for name, (env, _) in wanted.items()})

    target = filled("target", spec.target, "")
    sources = [dataclasses.replace(s, endpoint=filled("source", s.endpoint, _suffix(s.name))) for s in spec.sources]
    salt_from_env(spec)
    if missing:
        raise RuntimeError(f"the job runs in cluster deploy mode: its driver needs {', '.join(missing)} in its "
                           "environment — on Kubernetes give the operator kubernetes_secret=; on YARN set it in the "
                           "cluster's configuration (never on the spark-submit command line)")
    spec.target, spec.sources = target, sources


def salt_from_env(spec) -> None:
    """A driver: the hash salt from its environment (``SALT_ENV``), where the submitter put it
    rather than in the spec's file (core/content/transforms.py)."""
    if not spec.hash_salt and os.environ.get(SALT_ENV):
        spec.hash_salt = os.environ[SALT_ENV]


def python_driver(master: str, deploy_mode: str | None = None) -> bool:
    """Whether the job's driver can run as a plain Python process: a local master in client mode."""
    return master.startswith("local") and not is_cluster(deploy_mode)


def python_driver_command(job: str, staged: Submission, master: str, conf: dict) -> tuple[list[str], dict]:
    """The command and environment that run ``job``'s script as a Python driver on a local master.
    ``$PYSPARK_SUBMIT_ARGS`` holds what spark-submit would have got, for a session the job may build."""
    args = ["--master", master, "--py-files", staged.py_files]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    env = {**staged.env_vars, "MASTER": master, "PYSPARK_SUBMIT_ARGS": shlex.join([*args, "pyspark-shell"])}
    return [env["PYSPARK_DRIVER_PYTHON"], job_script(job), *staged.application_args], env


def prepare(spec, workdir: str, master: str = "local[2]", conf: dict | None = None,
            use_spark_submit: bool = False) -> tuple[list[str], dict]:
    """Stage ``spec`` in ``workdir`` (client mode); returns the command and its environment: a Python
    driver on a local master (unless ``use_spark_submit``), else spark-submit."""
    staged = stage(spec, workdir, master)
    conf = {"spark.ui.enabled": "false", "spark.log.level": "WARN", **staged.conf, **(conf or {})}
    if python_driver(master) and not use_spark_submit:
        return python_driver_command(spec.job, staged, master, conf)
    cmd = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", master,
           "--py-files", staged.py_files]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + [job_script(spec.job), *staged.application_args], staged.env_vars


def run_driver(cmd: list[str], env: dict, line=None, timeout: float | None = None, started=None) -> tuple[int, str]:
    """Run a driver command, passing each output line to ``line`` (if given); returns the exit
    code and the output's last 3,000 characters. Killed after ``timeout`` seconds; ``started``
    gets the process (to kill it from elsewhere)."""
    tail: list[str] = []
    with subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        if started is not None:
            started(proc)
        expired = threading.Event()

        def kill() -> None:
            expired.set()
            proc.kill()

        watchdog = threading.Timer(timeout, kill) if timeout else None
        if watchdog:
            watchdog.start()
        try:
            for text in proc.stdout:
                if line is not None:
                    line(text.rstrip("\n"))
                tail = (tail + [text])[-200:]
            code = proc.wait()
        finally:
            if watchdog:
                watchdog.cancel()
        if expired.is_set():
            raise subprocess.TimeoutExpired(cmd, timeout)
    return code, "".join(tail)[-3000:]


def spark_submit(spec, master: str = "local[2]", conf: dict | None = None, timeout: float | None = None,
                 log=None, use_spark_submit: bool = False, line=None) -> dict:
    """Run ``spec``'s job without Airflow (client mode; a Python driver on a local master unless
    ``use_spark_submit``); returns the job's result. The driver's output goes line by line to
    ``line`` (a callable) or the file ``log``."""
    if line is None and log is not None:
        line = lambda text: print(text, file=log, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="airflow-sync-") as tmp:
        cmd, env = prepare(spec, tmp, master, conf, use_spark_submit)
        code, tail = run_driver(cmd, env, line, timeout)
        result = read_result(spec.result_path)
        if not result:
            result = {"status": "failed", "error": f"{os.path.basename(cmd[0])} exited {code}: "
                                                   f"{'' if line else tail}"}
        return result
