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
