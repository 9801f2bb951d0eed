"""No plaintext on disk: planted text, speakers and titles never appear in a file or a backup.

Not in any file under the data directory (the index snapshots written at the
stop included), nor in a backup.
"""

from __future__ import annotations

from pathlib import Path

from _helpers import append, create_thread, files_containing, run_cli, search_texts, unique
from conftest import Lethe


def _plant(lethe: Lethe) -> list[str]:
    c = lethe.client("alice")
    title = unique("titleplant")
    thread = create_thread(c, "alice", title=title)
    planted = [title]
    for commit in (False, True):
        text = f"secretplant{unique()} my card number"
        speaker = unique("speakerplant")
        append(c, thread, [text], commit=commit, speaker=speaker)
        planted += [text, text.split()[0], speaker]
    # Make sure the records are really stored and readable through the service.
    assert planted[4] in search_texts(c, "alice", planted[4])
    return planted


def test_no_planted_plaintext_in_data_dir_files(lethe: Lethe) -> None:
    planted = _plant(lethe)
    lethe.stop()
    files = [p for p in lethe.data_dir.rglob("*") if p.is_file()]
    assert any(p.name == "data.mdb" for p in files)
    assert any(p.suffix == ".snapshot" for p in files)  # the index snapshot written at the stop
    assert files_containing(lethe.data_dir, planted) == []


def test_no_planted_plaintext_in_backup(lethe: Lethe, tmp_path: Path) -> None:
    planted = _plant(lethe)
    out = tmp_path / "backup"
    assert run_cli(["backup", "--data", str(lethe.data_dir), "--out", str(out)]) == 0
    assert (out / "data.mdb").stat().st_size > 0
    assert files_containing(out, planted) == []
    lethe.stop()
    assert files_containing(lethe.data_dir, planted) == []


def test_scan_detects_planted_plaintext(tmp_path: Path) -> None:
    """The scanner itself can fail: a file holding the needle is reported."""
    needle = unique("needle")
    (tmp_path / "a.bin").write_bytes(b"\x00xx" + needle.encode() + b"yy")
    (tmp_path / "b.bin").write_bytes(needle.encode("utf-16-le"))
    (tmp_path / "c.bin").write_bytes(b"nothing here")
    hits = files_containing(tmp_path, [needle])
    assert sorted(h[0].rsplit("/", 1)[1] for h in hits) == ["a.bin", "b.bin"]
