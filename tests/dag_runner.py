"""A process that runs Airflow CLI commands (``dags test``, ``tasks test``) one after another.

Each ``airflow dags test`` process pays about 9 s before its first task runs: Airflow's imports
and its in-process execution API (a Cadwyn app built per process; ``in_process_api_server`` is
cached for the process's life). A test module's runs share one such process per environment
(tests/airflow_run.py), so they pay it once. A command runs exactly as ``airflow <args>`` does —
the same parser and command function — with everything it, its tasks and their subprocesses
write (file descriptors 1 and 2) going to a file of its own.

Protocol: one JSON request per line on stdin, ``{"args": [...], "out": path}``; one JSON reply
per line on stdout, ``{"returncode": n}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _run(args: list[str]) -> int:
    from airflow.cli import cli_parser

    try:
        parsed = cli_parser.get_parser().parse_args(args)
        parsed.func(parsed)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the CLI's process would die of it: exit 1, traceback in the output
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)  # the caller's pipe: kept aside from the redirection
    for line in sys.stdin:
        request = json.loads(line)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out, 1)
        os.dup2(out, 2)
        try:
            code = _run(request["args"])
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (*saved, out):
                os.close(fd)
        replies.write(json.dumps({"returncode": code}) + "\n")
    # stdin closed: every command has ended and written all it had. Airflow's atexit hooks and
    # threads (its in-process API, pools, log handlers) held a normal exit: 2.0 s for a runner that
    # had run `db migrate` alone (0.02 s now); the example DAGs' module teardown took 12.5 s
    replies.close()
    os._exit(0)


if __name__ == "__main__":
    main()
