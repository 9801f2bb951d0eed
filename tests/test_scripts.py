"""The shell scripts of the README set up what they promise.

``scripts/_venv.sh`` (sourced by ``scripts/test.sh`` and ``scripts/demo.sh``)
makes ``.venv`` again when it holds a Python that is too old, broken, or not
the ``PYTHON`` asked for, instead of reusing it forever.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _source_venv(cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(ROOT / "scripts" / "_venv.sh", cwd / "_venv.sh")
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail; . ./_venv.sh"],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _fake_python(path: Path, version: str, *, new_enough: bool) -> None:
    """A stand-in interpreter that answers _venv.sh's two questions.

    The questions: its version, and whether it is at least 3.11.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    ok = 0 if new_enough else 1
    path.write_text(f'#!/bin/sh\ncase "$2" in *print*) echo {version};; *) exit {ok};; esac\n')
    path.chmod(0o755)


def _fake_venv(cwd: Path, version: str, *, new_enough: bool = False) -> None:
    _fake_python(cwd / ".venv" / "bin" / "python", version, new_enough=new_enough)


def test_a_venv_of_a_too_old_python_is_made_again(tmp_path: Path) -> None:
    _fake_venv(tmp_path, "3.9")
    done = _source_venv(tmp_path, PYTHON=sys.executable)
    assert done.returncode == 0, done.stderr
    assert "making .venv again: its Python 3.9 is older than 3.11" in done.stdout
    assert (tmp_path / ".venv" / "pyvenv.cfg").exists()
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    check = subprocess.run(
        [str(tmp_path / ".venv" / "bin" / "python"), "-c", "import sys; print(sys.version)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert check.stdout.startswith(version)
    # Made once: sourced again it is kept as it is.
    again = _source_venv(tmp_path, PYTHON=sys.executable)
    assert again.returncode == 0
    assert "making .venv again" not in again.stdout


def test_a_venv_of_another_python_than_asked_is_made_again(tmp_path: Path) -> None:
    _fake_venv(tmp_path, "3.99", new_enough=True)
    done = _source_venv(tmp_path, PYTHON=sys.executable)
    assert done.returncode == 0, done.stderr
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"it has Python 3.99 but PYTHON={sys.executable} is {version}" in done.stdout
    assert (tmp_path / ".venv" / "pyvenv.cfg").exists()


def test_a_python_that_is_missing_or_too_old_is_refused(tmp_path: Path) -> None:
    missing = _source_venv(tmp_path, PYTHON=str(tmp_path / "no-such-python"))
    assert missing.returncode == 2
    assert "set PYTHON=" in missing.stderr
    old = tmp_path / "python3.9"
    _fake_python(old, "3.9", new_enough=False)
    too_old = _source_venv(tmp_path, PYTHON=str(old))
    assert too_old.returncode == 2
    assert "is Python 3.9; Lethe needs 3.11 or newer" in too_old.stderr
    assert not (tmp_path / ".venv").exists()
