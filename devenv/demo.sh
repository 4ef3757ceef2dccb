#!/usr/bin/env bash
# Command 1: set up, then run the main job end to end on the local stand-ins.
set -euo pipefail
cd "$(dirname "$0")/.."
bash devenv/setup.sh
exec .venv/bin/python -m devenv.demo "$@"
