#!/usr/bin/env bash
# The test command: create .venv (if missing), install Lethe with its dev,
# langgraph and onnx extras, then lint (ruff), type-check (mypy --strict) and run the tests
# (pytest; the black-box tests start the real server on loopback); check
# proto/ with buf (scripts/check_proto.sh), deploy/ with promtool and
# systemd-analyze (scripts/check_deploy.sh), and run a Go client generated
# from proto/ against the server (scripts/check_go_client.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# .venv of a Python >= 3.11 ($PYTHON if set; a wrong one is made again)
. scripts/_venv.sh
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev,langgraph,onnx]'
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy (strict)"
.venv/bin/mypy lethe server shredder index scripts bench tests
echo "== proto (buf)"
bash scripts/check_proto.sh
echo "== deploy (promtool, systemd-analyze)"
bash scripts/check_deploy.sh
echo "== a Go client generated from proto/, against a real server"
bash scripts/check_go_client.sh
echo "== pytest"
.venv/bin/python -m pytest -q "$@"
