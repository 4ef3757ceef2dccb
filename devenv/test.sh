#!/usr/bin/env bash
# Command 2: set up, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash devenv/setup.sh
exec .venv/bin/python -m pytest "$@"
