# Sourced by scripts/test.sh and scripts/demo.sh (from the repository root):
# make .venv a virtual environment of a Python >= 3.11, the one $PYTHON
# names when it is set (default python3). A .venv of a Python that is too
# old, broken, or of another version than $PYTHON is made again, saying why,
# instead of being reused forever.
PY="${PYTHON:-python3}"
_lethe_py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
_lethe_py_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

if ! want=$(_lethe_py_version "$PY"); then
    echo "lethe: no working Python at '$PY'; set PYTHON=/path/to/python3.11 (or newer)" >&2
    exit 2
fi
if ! _lethe_py_ok "$PY"; then
    echo "lethe: '$PY' is Python $want; Lethe needs 3.11 or newer: set PYTHON=/path/to/python3.11" >&2
    exit 2
fi
if [ -e .venv ]; then
    why=""
    if ! have=$(_lethe_py_version .venv/bin/python); then
        why="it has no working Python"
    elif ! _lethe_py_ok .venv/bin/python; then
        why="its Python $have is older than 3.11"
    elif [ -n "${PYTHON:-}" ] && [ "$have" != "$want" ]; then
        why="it has Python $have but PYTHON=$PYTHON is $want"
    fi
    if [ -n "$why" ]; then
        echo "lethe: making .venv again: $why"
        rm -rf .venv
    fi
fi
if [ ! -e .venv ]; then
    "$PY" -m venv .venv
fi
