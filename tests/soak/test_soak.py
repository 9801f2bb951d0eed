"""The soak's short form (``bench/soak.py``): mixed traffic, SIGTERM, restart and restore, checked.

The full form is one command in docs/benchmarks.md. Client processes with mixed
traffic, Watch streams and a hot backup, then SIGTERM under load, a restart and
a restore, all checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


@pytest.mark.slow
def test_short_soak_loses_nothing_and_stays_bounded(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    result = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--duration",
            "15",
            "--clients",
            "2",
            "--watchers",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["sigterm"]["exit"] == 0
    writes = report["writes"]
    assert writes["appends_acknowledged"] > 0
    assert writes["lost"] == 0
    assert writes["forgotten_but_readable"] == 0
    restore = report["restore"]
    assert restore["acknowledged_before_backup"] > 0
    assert restore["missing"] == 0
    assert restore["forgotten_but_readable"] == 0
    assert report["empty_windows"] == []
    assert report["events_received"] > 0
    assert {"AppendTurns", "Search", "Forget", "GetTurn"} <= set(report["methods"])
    assert all(row["p99_ms"] <= 2000 for row in report["methods"].values())
