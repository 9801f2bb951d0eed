"""The operations kit in ``deploy/`` fits the server it watches.

Every metric the alert rules and the dashboard read is one ``lethe serve``
exports (or one announced for a coming release), the unit and the backup script
agree on where things live, and the backup script backs up data and nothing
else. (promtool and systemd-analyze check the files themselves:
``scripts/check_deploy.sh``.)
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server import LetheServer, ServerConfig

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
_METRIC = re.compile(r"\b(lethe_[a-z_]+|grpc_server_[a-z_]+)\b")


def _exported() -> set[str]:
    from server._metrics import Metrics

    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_count", "_sum", "_created"),
        }.get(family.type, ())
        names.update(family.name + s for s in suffixes)
    return names


def _referenced(text: str) -> set[str]:
    return {m for m in _METRIC.findall(text) if not m.startswith("lethe_backup")}


def test_alerts_and_dashboard_read_only_exported_metrics() -> None:
    alerts = (DEPLOY / "prometheus" / "lethe-alerts.yml").read_text()
    exprs = " ".join(
        t["expr"]
        for p in json.loads((DEPLOY / "grafana" / "lethe-dashboard.json").read_text())["panels"]
        for t in p.get("targets", [])
    )
    exported = _exported()
    for source in (alerts, exprs):
        used = _referenced(source)
        assert used, source[:80]
        assert used - exported == set()
    # Every alert the issue asks for is there.
    for metric in (
        "lethe_shred_horizon_seconds",
        "lethe_outstanding_deletions",
        "lethe_orphan_derivatives",
        "lethe_overdue_commitments",
        "lethe_unreadable_records",
        "lethe_refused_calls_total",
        "lethe_stray_key_files",
    ):
        assert metric in _referenced(alerts), metric


def test_unit_and_backup_script_agree_on_paths() -> None:
    unit = (DEPLOY / "systemd" / "lethe.service").read_text()
    script = (DEPLOY / "backup" / "lethe-backup.sh").read_text()
    for path in (
        "/opt/lethe/venv/bin/lethe",
        "/var/lib/lethe/data",
        "/var/lib/lethe-kek/lethe.kek",
    ):
        assert path in unit, path
        assert path in script, path
    assert "LoadCredential" not in re.sub(r"#.*", "", unit)  # read-only: see the unit's comment
    assert "/var/backups/lethe" in (DEPLOY / "backup" / "lethe-backup.cron").read_text()


def _run_backup(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(DEPLOY / "backup" / "lethe-backup.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(shutil.which("realpath") is None, reason="needs coreutils realpath")
def test_backup_script_copies_data_only_and_keeps_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LETHE_KEK", raising=False)
    data, kek = tmp_path / "data", tmp_path / "kek" / "lethe.kek"
    server = LetheServer(
        ServerConfig(
            data_dir=data,
            kek_file=kek,
            listen="127.0.0.1:0",
            metrics_listen=None,
            sweep_interval=0.0,
            embedder="none",
        )
    )
    server.start()
    server.stop(grace=0)
    env = {
        **{k: v for k, v in os.environ.items() if k != "LETHE_KEK"},
        "LETHE_BIN": str(Path(sys.executable).with_name("lethe")),
        "LETHE_DATA": str(data),
        "LETHE_KEK_FILE": str(kek),
        "LETHE_BACKUP_ROOT": str(tmp_path / "backups"),
        "LETHE_BACKUP_KEEP": "2",
    }
    for _ in range(3):
        done = _run_backup(env)
        assert done.returncode == 0, done.stderr
        time.sleep(1.05)  # the names are stamped to the second
    kept = sorted((tmp_path / "backups").iterdir())
    assert len(kept) == 2
    assert all(re.fullmatch(r"lethe-\d{8}T\d{6}Z", p.name) for p in kept)
    keys = json.loads(kek.read_text())["keys"].values()
    secrets = [s.encode() for s in keys] + [base64.b64decode(s) for s in keys]
    keystore = {p.name for p in (data / "keystore").iterdir()}
    for backup in kept:
        files = [p for p in backup.rglob("*") if p.is_file()]
        assert any(p.name == "data.mdb" for p in files)
        assert not any(p.parent.name == "keystore" for p in files), files
        assert not [p for p in files for key in secrets if key in p.read_bytes()]
        assert keystore  # the keystore exists beside the data, and stayed there
    inside = _run_backup({**env, "LETHE_BACKUP_ROOT": str(data / "backups")})
    assert inside.returncode == 2
    assert "inside the data directory" in inside.stderr
