"""The crash harness's short form (see ``tests/crash/random_kills.py``): 10 SIGKILLs under load.

10 SIGKILLs of the real server under a mixed load of every mutating RPC, with
rotation running; after each restart every acknowledged operation is checked
against the store and the audit is clean. The full run (100 kills) is
``.venv/bin/python tests/crash/random_kills.py --kills 100``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from random_kills import run


@pytest.mark.slow
def test_ten_random_kills_under_load_lose_nothing_acknowledged(tmp_path: Path) -> None:
    lines: list[str] = []
    report = run(tmp_path, kills=10, seed=1, out=lines.append)
    assert report.kills == 10
    assert report.acknowledged > 50, lines
    assert report.judged > 200, lines
    assert report.forgotten_checked > 0, lines  # the keystore-copy check had turns to try


@pytest.mark.slow
def test_five_random_kills_of_a_two_process_group_lose_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    """``lethe serve --processes 2``: both processes write; each kill SIGKILLs both."""
    lines: list[str] = []
    report = run(tmp_path, kills=5, seed=2, out=lines.append, processes=2)
    assert report.kills == 5
    assert report.acknowledged > 25, lines
    assert report.judged > 100, lines
