#!/usr/bin/env bash
# The main job: create .venv (if missing), install Lethe, and run `lethe demo`
# on the LoCoMo conversations in ../shared/data (data in ./lethe-data).
# Extra arguments go to `lethe demo` (see `lethe demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
# .venv of a Python >= 3.11 ($PYTHON if set; a wrong one is made again)
. scripts/_venv.sh
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
exec .venv/bin/lethe demo "$@"
