#!/usr/bin/env bash
# The test command: create .venv (if missing), install Lethe with its dev,
# langgraph, onnx, mcp, tracing and bench (Chroma, matplotlib) extras, then lint (ruff), type-check (mypy --strict) and run the tests
# (pytest; the black-box tests start the real server on loopback); check
# proto/ with buf (scripts/check_proto.sh), deploy/ with promtool and
# systemd-analyze (scripts/check_deploy.sh), and run a Go client generated
# from proto/ against the server (scripts/check_go_client.sh); the Node.js
# client in tests/crosslang/node and the TypeScript client in clients/typescript
# are installed with `npm ci` (required under CI) and run by pytest against a
# real server (the TypeScript client over gRPC and Connect, with TLS); nginx
# (Debian's nginx-light) is installed for the sharding test
# (scripts/install_nginx.sh); pytest also runs curl against the Connect listener.
set -euo pipefail
cd "$(dirname "$0")/.."
# .venv of a Python >= 3.11 ($PYTHON if set; a wrong one is made again)
. scripts/_venv.sh
.venv/bin/python -m pip install --quiet --upgrade pip 'setuptools>=77'
.venv/bin/python -m pip install --quiet -e '.[dev,langgraph,onnx,mcp,tracing,bench]'
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
echo "== nginx for the sharding test (tests/test_shards.py)"
bash scripts/install_nginx.sh
if command -v npm >/dev/null 2>&1; then
    echo "== npm ci (tests/crosslang/node, clients/typescript)"
    (cd tests/crosslang/node && npm ci --no-audit --no-fund --loglevel=error)
    (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
elif [ -n "${CI:-}" ]; then
    echo "npm is required under CI (the Node.js and TypeScript clients)" >&2
    exit 1
fi
if ! command -v curl >/dev/null 2>&1 && [ -n "${CI:-}" ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y -qq --no-install-recommends curl >/dev/null 2>&1 \
            || { apt-get update -qq && apt-get install -y -qq --no-install-recommends curl >/dev/null; }
    else
        echo "curl is required under CI (the Connect listener's curl test)" >&2
        exit 1
    fi
fi
echo "== pytest"
.venv/bin/python -m pytest -q --durations=25 "$@"
