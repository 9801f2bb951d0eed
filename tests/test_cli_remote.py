"""Erasure, export and proof from a shell: ``lethe forget``, ``export``, ``receipt``, ``audit``.

Each command runs as a subprocess, as a data-protection officer's script would
run it, against a real server, the token in ``LETHE_TOKEN``: the receipt
``forget`` prints verifies offline with the keys ``receipt public-key`` prints,
a tampered one does not (exit 1); ``export`` writes a file that reads back to
what the server streams; and the exit statuses are those of every ``lethe``
command (0 done, 1 a failed check or nothing to forget, 2 a server that cannot
be reached or refuses).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Lethe, free_port

from lethe.client import RecordDeleted
from lethe.remote import read_export
from lethe.v1 import common_pb2


def _cli(*args: str, token: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    if token:
        base["LETHE_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _json(done: subprocess.CompletedProcess[str], status: int = 0) -> Any:
    assert done.returncode == status, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def served(lethe: Lethe) -> tuple[Lethe, str, list[str]]:
    """A server with alice's committed turns; (server, target, turn names)."""
    c = lethe.client("alice")
    thread = c.create_thread("owners/alice", thread_id="t")
    turns = c.append_turns(
        thread.name, [{"role": "USER", "text": t, "commit": True} for t in ("a", "b", "c")]
    ).turns
    return lethe, f"127.0.0.1:{lethe.port}", [t.name for t in turns]


def test_a_receipt_from_lethe_forget_verifies_offline_and_a_tampered_one_does_not(
    served: tuple[Lethe, str, list[str]], tmp_path: Path
) -> None:
    lethe, target, turns = served
    token = lethe.token("alice")
    saved = tmp_path / "receipt.json"
    doc = _json(
        _cli("forget", "--target", target, turns[0], "--out", str(saved), "--json", token=token)
    )
    receipt = doc["receipt"]
    assert receipt["targets"] == [turns[0]]
    assert receipt["deleted"] == "1"
    assert json.loads(saved.read_text()) == doc
    keys = tmp_path / "keys.json"
    published = _json(_cli("receipt", "public-key", "--target", target, "--json", token=token))
    assert published["store_id"] == receipt["store_id"]
    assert [k["key_id"] for k in published["keys"]] == [receipt["signing_key_id"]]
    keys.write_text(json.dumps(published))

    verified = _json(_cli("receipt", "verify", str(saved), "--public-key", str(keys), "--json"))
    assert verified["verified"] is True
    assert [(r["name"], r["valid"]) for r in verified["receipts"]] == [(receipt["name"], True)]
    # The bare base64 key works too, and without --json one line per receipt.
    plain = _cli(
        "receipt", "verify", str(saved), "--public-key", published["keys"][0]["public_key"]
    )
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip().endswith(": ok")

    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps({"receipt": {**receipt, "deleted": "0"}}))
    refused = _cli("receipt", "verify", str(tampered), "--public-key", str(keys), "--json")
    assert _json(refused, status=1)["receipts"][0]["valid"] is False
    assert "does not match" in json.loads(refused.stdout)["receipts"][0]["why"]

    alien = tmp_path / "alien.json"  # valid signature, but the key file names another store
    alien.write_text(json.dumps({**published, "store_id": "f" * 32}))
    other = _cli("receipt", "verify", str(saved), "--public-key", str(alien), "--json")
    assert "issued by store" in _json(other, status=1)["receipts"][0]["why"]


def test_lethe_forget_exit_statuses(served: tuple[Lethe, str, list[str]], tmp_path: Path) -> None:
    lethe, target, turns = served
    token = lethe.token("alice")
    assert _cli("forget", "--target", target, turns[1], token=token).returncode == 0
    again = _cli("forget", "--target", target, turns[1], token=token)
    assert again.returncode == 1  # already gone: nothing to forget
    assert "RECORD_DELETED" in again.stderr
    bob = _cli("forget", "--target", target, turns[2], token=lethe.token("bob"))
    assert bob.returncode == 2
    assert "may not act" in bob.stderr
    bad = _cli("forget", "--target", target, turns[2], token="lethe_" + "A" * 43)
    assert bad.returncode == 2
    assert "refused the token" in bad.stderr
    nothing = _cli("forget", "--target", target, token=token)
    assert nothing.returncode == 2  # no name: the server refuses the request's form
    away = _cli("forget", "--target", f"127.0.0.1:{free_port()}", turns[2], token=token)
    assert away.returncode == 2
    assert "cannot connect" in away.stderr
    missing = _cli("forget", "--target", target, turns[2])
    assert missing.returncode == 2  # no token at all
    c = lethe.client("alice")
    assert c.get_turn(turns[2]).text == "c"  # none of the refused calls deleted it


def test_lethe_forget_of_a_range_and_a_human_receipt(
    served: tuple[Lethe, str, list[str]],
) -> None:
    lethe, target, _ = served
    done = _cli(
        "forget",
        "--target",
        target,
        "--range",
        "owners/alice/threads/t:2-3",
        token=lethe.token("alice"),
    )
    assert done.returncode == 0, done.stderr
    assert "2 records deleted" in done.stdout
    assert "signed by store" in done.stdout
    listed = list(lethe.client("alice").iter_deletions("owners/alice"))
    assert [list(r.targets) for r in listed] == [
        ["owners/alice/threads/t/turns/2", "owners/alice/threads/t/turns/3"]
    ]


def test_lethe_audit_against_a_server(served: tuple[Lethe, str, list[str]]) -> None:
    lethe, target, _ = served
    token = lethe.token(admin=True)
    doc = _json(
        _cli(
            "audit", "--target", target, "--owner", "alice", "--owner", "bob", "--json", token=token
        )
    )
    assert doc["healthy"] is True
    assert doc["owners"] == {}
    assert doc["totals"]["checked"] >= 3
    assert doc["totals"]["index_drift"] == 0
    no_owner = _cli("audit", "--target", target, token=token)
    assert no_owner.returncode == 2
    assert "--owner" in no_owner.stderr


def test_rotating_the_signing_key_keeps_old_receipts_verifiable(
    served: tuple[Lethe, str, list[str]], tmp_path: Path, kek_env: str
) -> None:
    lethe, target, turns = served
    token = lethe.token("alice")
    saved = tmp_path / "old.json"
    assert (
        _cli("forget", "--target", target, turns[0], "--out", str(saved), token=token).returncode
        == 0
    )
    data = str(lethe.data_dir)
    busy = _cli("receipt", "rotate-key", "--data", data, LETHE_KEK=kek_env)
    assert busy.returncode == 2  # the server holds the data directory
    assert "stop it" in busy.stderr
    lethe.stop()
    rotated = _json(_cli("receipt", "rotate-key", "--data", data, "--json", LETHE_KEK=kek_env))
    old = json.loads(saved.read_text())["receipt"]["signing_key_id"]
    assert rotated["retired_key_id"] == old
    assert rotated["key_id"] != old
    keys = _json(_cli("receipt", "public-key", "--data", data, "--json", LETHE_KEK=kek_env))
    assert [k["key_id"] for k in keys["keys"]] == [old, rotated["key_id"]]
    assert keys["keys"][0]["retire_time"] is not None
    assert keys["keys"][1]["retire_time"] is None
    key_file = tmp_path / "keys.json"
    key_file.write_text(json.dumps(keys))
    assert _cli("receipt", "verify", str(saved), "--public-key", str(key_file)).returncode == 0
    lethe.start()
    c = lethe.client("alice")
    fresh = c.forget([turns[1]])
    assert fresh.signing_key_id == rotated["key_id"]
    assert isinstance(fresh, common_pb2.DeletionReceipt)


def test_lethe_export_round_trips_and_its_receipts_verify(
    served: tuple[Lethe, str, list[str]], tmp_path: Path
) -> None:
    lethe, target, turns = served
    token = lethe.token("alice")
    c = lethe.client("alice")
    c.forget([turns[0]])
    out = tmp_path / "alice.jsonl"
    doc = _json(
        _cli(
            "export",
            "--target",
            target,
            "--owner",
            "alice",
            "--out",
            str(out),
            "--json",
            token=token,
        )
    )
    assert (doc["threads"], doc["turns"], doc["receipts"]) == (1, 2, 1)
    assert doc["bytes"] == out.stat().st_size
    read = list(read_export(out))
    streamed = list(c.export_owner("owners/alice"))
    for items in (read, streamed):
        items[0].header.ClearField("export_time")
    assert read == streamed
    assert [i.turn.text for i in read if i.HasField("turn")] == ["b", "c"]
    keys = tmp_path / "keys.json"
    keys.write_text(_cli("receipt", "public-key", "--target", target, "--json", token=token).stdout)
    verified = _json(_cli("receipt", "verify", str(out), "--public-key", str(keys), "--json"))
    assert verified["verified"] is True
    assert len(verified["receipts"]) == 1
    human = _cli("export", "--target", target, "--owner", "alice", "--out", str(out), token=token)
    assert human.returncode == 0, human.stderr
    assert "2 turns" in human.stdout
    assert human.stderr == ""  # no progress bar off a terminal


def test_lethe_export_refused_leaves_no_file(
    served: tuple[Lethe, str, list[str]], tmp_path: Path
) -> None:
    lethe, target, _ = served
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "alice.jsonl"
    done = _cli(
        "export",
        "--target",
        target,
        "--owner",
        "alice",
        "--out",
        str(out),
        token=lethe.token("bob"),
    )
    assert done.returncode == 2
    assert "may not act" in done.stderr
    assert list(out.parent.iterdir()) == []  # neither the file nor a partial one


def test_lethe_retention_on_records_and_an_owners_default(
    served: tuple[Lethe, str, list[str]],
) -> None:
    lethe, target, turns = served
    token = lethe.token("alice")
    doc = _json(
        _cli("retention", "--target", target, turns[0], "--ttl", "1s", "--json", token=token)
    )
    assert doc["records"] == [turns[0]]
    assert doc["expire_time"] is not None
    assert doc["owner_default_seconds"] is None
    owner = _json(
        _cli("retention", "--target", target, "owners/alice", "--ttl", "30d", "--json", token=token)
    )
    assert owner == {"records": [], "expire_time": None, "owner_default_seconds": 2592000.0}
    human = _cli("retention", "--target", target, "owners/alice", "--clear", token=token)
    assert human.returncode == 0, human.stderr
    assert "no default retention" in human.stdout
    past = _cli(
        "retention",
        "--target",
        target,
        turns[1],
        "--expire-time",
        "2001-01-01T00:00:00Z",
        token=token,
    )
    assert past.returncode == 2
    assert "expire_time" in past.stderr
    missing = _cli("retention", "--target", target, turns[0] + "9", "--ttl", "1h", token=token)
    assert missing.returncode == 1
    time.sleep(1.1)
    c = lethe.client("alice")
    with pytest.raises(RecordDeleted):
        c.get_turn(turns[0])
    assert c.get_turn(turns[1]).text == "b"


def test_lethe_export_counts_its_items_on_a_terminal_only_without_quiet(
    served: tuple[Lethe, str, list[str]], tmp_path: Path
) -> None:
    from test_cli_scripting import _with_terminal_stderr

    lethe, target, _ = served
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env["LETHE_TOKEN"] = lethe.token("alice")
    args = ("export", "--target", target, "--owner", "alice")
    rc, out, terminal = _with_terminal_stderr(*args, "--out", str(tmp_path / "a.jsonl"), env=env)
    assert rc == 0
    assert out.startswith("wrote ")
    assert "export owners/alice" in terminal  # tqdm's count of the items
    rc, out, terminal = _with_terminal_stderr(
        *args, "--out", str(tmp_path / "b.jsonl"), "--quiet", env=env
    )
    assert rc == 0
    assert "export owners/alice" not in terminal
