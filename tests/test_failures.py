"""The failure policy (core/failures.py), the job's guard (core/guard.py) and what the operator
makes of a failed job: pure logic on a fake clock, and real processes for the guard."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pymysql
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_sync_provider.core.failures import (
    SOURCE,
    TARGET,
    Failure,
    Outage,
    ServerUnreachable,
    classify,
    common,
    sensor_verdict,
)
from airflow_sync_provider.core.guard import end_tree, submitter_alive, submitter_env


def _http_error(code: int | None, status: int = 500) -> DatabaseError:
    head = f"Received ClickHouse exception, code: {code}" if code else f"HTTP driver received HTTP status {status}"
    return DatabaseError(f"{head}, server response: Code: {code}. DB::Exception: x. (X)", code=code)


@pytest.mark.parametrize("code", [252, 241, 159, 242, 243, 209, 210, 319])
def test_clickhouse_passing_codes_are_transient(code):
    failure = classify(_http_error(code))
    assert failure.transient is True and failure.side == TARGET and str(code) in failure.cause


@pytest.mark.parametrize("code, remedy", [(497, "grant the target user"), (164, "readonly=1"),
                                          (60, "run the full load again"), (53, "reload the table in full")])
def test_clickhouse_permanent_codes_say_what_to_do(code, remedy):
    failure = classify(_http_error(code))
    assert failure.transient is False and remedy in failure.remedy
    assert failure.advice().startswith("A retry will not help: ")


def test_clickhouse_transport_errors_and_bare_5xx_are_transient():
    refused = OperationalError("Error HTTPConnectionPool(host='h', port=1): Max retries exceeded (Connection refused)")
    assert classify(refused) == Failure(True, TARGET, "connection refused")
    assert classify(_http_error(None, 503)).transient is True
    assert classify(DatabaseError("Received ClickHouse exception, code: 1001, server response: …", code=1001)) \
        .transient is None  # an answer nothing says is passing: Airflow's retries decide


@pytest.mark.parametrize("error, transient", [
    (pymysql.err.OperationalError(2013, "Lost connection to server during query"), True),
    (pymysql.err.OperationalError(2003, "Can't connect to MySQL server on '127.0.0.1'"), True),
    (pymysql.err.OperationalError(1040, "Too many connections"), True),
    (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), True),
    (pymysql.err.OperationalError(1969, "Query execution was interrupted (max_statement_time exceeded)"), True),
    (pymysql.err.OperationalError(3024, "maximum statement execution time exceeded"), True),
    (pymysql.err.OperationalError(1290, "The MariaDB server is running with the --read-only option"), True),
    (pymysql.err.OperationalError(1045, "Access denied for user 'r'"), False),
    (pymysql.err.ProgrammingError(1146, "Table 'd.t' doesn't exist"), False),
    (pymysql.err.OperationalError(1142, "SELECT command denied"), False),
])
def test_mysql_errors_by_code(error, transient):
    failure = classify(error)
    assert failure.transient is transient and failure.side == SOURCE


def test_driver_errors_without_a_code():
    connectorx = RuntimeError("timed out waiting for connection: DriverError { Could not connect to address "
                              "`127.0.0.1:1': Connection refused (os error 111) }")
    assert classify(connectorx) == Failure(True, SOURCE, classify(connectorx).cause)
    assert classify(ConnectionResetError(104, "reset")).transient is True
    assert classify(ValueError("a bug")).transient is None


def test_the_chain_and_the_jobs_own_errors_decide():
    class Stopped(RuntimeError):
        retry_helps = False

    try:
        try:
            raise pymysql.err.OperationalError(2013, "Lost connection")
        except Exception as exc:
            raise RuntimeError("pipeline failed at checkpoint …") from exc
    except RuntimeError as wrapped:
        assert classify(wrapped).transient is True and classify(wrapped).side == SOURCE
    assert classify(Stopped("binlog off")).transient is False
    error = RuntimeError("shards [1, 2] failed")
    error.failure = Failure(False, TARGET, "ACCESS_DENIED (497)", "grant it")
    assert classify(error) is error.failure


def test_several_shards_failures_share_a_class_or_none():
    denied = Failure(False, TARGET, "ACCESS_DENIED (497)", "grant")
    assert common([denied, denied]) == denied
    assert common([denied, Failure(True, TARGET, "TOO_MANY_PARTS (252)")]) is None
    assert common([]) is None


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_one_bounded_wait_retries_a_passing_failure_and_gives_up_past_the_bound():
    clock = Clock()
    outage = Outage(10, {TARGET: "ClickHouse h:8123"}, clock=clock, sleep=clock.sleep)
    calls = []

    def flaky():
        calls.append(clock.now)
        if len(calls) < 4:
            raise _http_error(252)
        return "ok"

    assert outage.call(flaky, "writing") == "ok" and not outage.down  # work that succeeds stops the clock
    assert calls[-1] < 10

    def dead():
        raise OperationalError("Error … (Connection refused)")

    with pytest.raises(ServerUnreachable, match=r"ClickHouse h:8123 has failed the job's work for 1\d s "
                                                r"\(connection refused\) while recording"):
        outage.call(dead, "recording")
    assert 10 < clock.now - calls[-1] < 10 + 5.5  # one wait for the whole outage, never a second
    with pytest.raises(ServerUnreachable):  # past the bound every wait gives up at once
        before = clock.now
        outage.call(dead, "recording again")
    assert clock.now == before


def test_a_permanent_failure_is_raised_without_a_wait():
    clock = Clock()
    outage = Outage(10, clock=clock, sleep=clock.sleep)
    with pytest.raises(DatabaseError):
        outage.call(lambda: (_ for _ in ()).throw(_http_error(497)), "inserting")
    assert clock.now == 0 and not outage.down


def test_a_probe_lets_channels_try_again_but_only_work_stops_the_clock():
    clock = Clock()
    outage = Outage(10, clock=clock, sleep=clock.sleep)
    outage.failed(_http_error(252))
    assert outage.wait_until_up({TARGET: lambda: None}) is True  # pings answer: try the work again …
    assert TARGET in outage.down  # … but the server still refused it: its clock runs on
    answers = iter([False, False, True])

    def probe():
        if not next(answers):
            raise ConnectionRefusedError()

    outage.answered(TARGET)
    outage.failed(OperationalError("Connection refused"))
    assert outage.wait_until_up({TARGET: probe}) is True and clock.now < 10
    clock.now += 20
    assert outage.wait_until_up({TARGET: lambda: None}) is False  # past the bound: no more waiting


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 4.0)), min_size=1, max_size=30), st.floats(1.0, 30.0))
def test_no_call_waits_past_the_bound(outcomes, bound):
    """Whatever the pattern of failures, a call returns or raises before ``bound`` + one backoff
    step after the outage began, and raises ServerUnreachable only once the outage outlasted it."""
    clock = Clock()
    outage = Outage(bound, clock=clock, sleep=clock.sleep)
    steps = iter(outcomes)

    def action():
        ok, took = next(steps, (True, 0.0))
        clock.now += took
        if not ok:
            raise _http_error(241)
        return "ok"

    try:
        outage.call(action, "x")
    except ServerUnreachable:
        assert outage.waited() > bound
    assert clock.now <= bound + 5.0 + sum(t for _, t in outcomes) + 1e-6


def test_sensor_checks_wait_out_a_passing_failure_and_fail_a_permanent_one():
    def down():
        raise OperationalError("Error … (Connection refused)")

    verdict, message, _ = sensor_verdict(down)
    assert verdict == "wait" and "ClickHouse did not answer the check (connection refused)" in message
    verdict, message, _ = sensor_verdict(lambda: (_ for _ in ()).throw(_http_error(497)))
    assert verdict == "failed" and "A retry will not help: grant the target user" in message
    with pytest.raises(ValueError):
        sensor_verdict(lambda: (_ for _ in ()).throw(ValueError("a bug")))


def test_the_operator_tells_airflow_whether_to_retry():
    from airflow_sync_provider.compat import AirflowException, AirflowFailException
    from airflow_sync_provider.operators.spark_job import job_failure

    permanent = job_failure("full_load", {"error": "… A retry will not help: grant …", "retry_helps": False}, "")
    assert type(permanent) is AirflowFailException and "grant" in str(permanent)
    for result in ({"error": "ServerUnreachable: …", "retry_helps": True}, {}):
        assert type(job_failure("full_load", result, "exited 1")) is AirflowException


# --- the guard and the process tree (real processes) --------------------------------------------------

_GUARDED = textwrap.dedent("""
    import os, sys, time
    from airflow_sync_provider.core.guard import Guard
    Guard(5.0, {}, lambda reason: open(sys.argv[1], "w").write(reason)).start()
    time.sleep(60)
""")


def test_a_job_whose_submitter_died_ends_within_a_second(tmp_path):
    """A driver's parent (spark-submit, the command line) SIGKILLed: the driver's guard ends it
    within about a second, saying why."""
    reason = tmp_path / "reason"
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {_GUARDED!r}, {str(reason)!r}]); "
                               "time.sleep(60)"])
    wait = time.monotonic() + 20
    while not psutil.Process(parent.pid).children() and time.monotonic() < wait:
        time.sleep(0.05)
    child = psutil.Process(parent.pid).children()[0]
    time.sleep(1.5)  # the child is up and guarded
    parent.kill()
    parent.wait()
    killed = time.monotonic()
    child.wait(10)  # not our child: its exit code is its new parent's (the guard's is ENDED_EXIT)
    assert time.monotonic() - killed < 5  # looked at every 0.5 s (generous: a busy machine)
    assert "has ended" in reason.read_text()


def test_the_submitter_is_named_by_pid_and_start_time():
    assert submitter_alive(submitter_env()["AIRFLOW_SYNC_SUBMITTER"])
    pid = os.getpid()
    assert not submitter_alive(f"{pid}:{psutil.Process(pid).create_time() - 100:.3f}")  # a reused pid
    assert not submitter_alive("garbage")


def test_on_kill_ends_the_whole_process_tree():
    from airflow_sync_provider.operators.spark_job import SparkJobOperator

    driver = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"])
    time.sleep(0.3)
    tree = [psutil.Process(driver.pid), *psutil.Process(driver.pid).children(recursive=True)]
    assert len(tree) == 3
    operator = SparkJobOperator(task_id="t")
    operator._driver = driver
    operator.on_kill()
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    end_tree(driver.pid)  # a tree already gone: nothing to do, no error
