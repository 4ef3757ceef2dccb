#!/usr/bin/env bash
# Command 2: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash devenv/setup.sh
# Two workers, one test file each at a time (a file's module fixtures stay in one worker; each
# worker starts its own MariaDB, ClickHouse endpoint and Spark): most of the suite waits on
# spark-submit start-ups and on writers, which overlap well on two cores.
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
