#!/usr/bin/env bash
# The test command: create .venv (if missing), install Lethe with its dev
# extras, then lint (ruff), type-check (mypy --strict) and run the tests
# (pytest; the black-box tests start the real server on loopback). The Node.js
# client in tests/interop/node is installed with `npm ci` (required under CI)
# and run by pytest against a real server.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy (strict)"
.venv/bin/mypy lethe server shredder index scripts bench tests
if command -v npm >/dev/null 2>&1; then
    echo "== npm ci (tests/interop/node)"
    (cd tests/interop/node && npm ci --no-audit --no-fund --loglevel=error)
elif [ -n "${CI:-}" ]; then
    echo "npm is required under CI (the Node.js interop client)" >&2
    exit 1
fi
echo "== pytest"
.venv/bin/python -m pytest -q "$@"
