"""``Lifecycle.ExportOwner`` through the real server, and its file round trip.

An owner with committed, pending, tainted, forgotten and expired turns, a
corrected fact, a summary with lineage and a sealed repair: the export holds
every live record the token may read (every memory version, the lineage edges,
the signed receipts), never a forgotten or expired one nor another owner's,
sealed material only when asked for, and the file ``lethe.remote`` writes
reads back to the same items.
"""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest
from _helpers import append, create_thread, reply, summary
from conftest import Client, Lethe

from lethe.client import OwnerNotAllowed
from lethe.receipts import verify_receipt
from lethe.remote import IncompleteExport, export_line, export_owner, read_export
from lethe.v1 import common_pb2, lifecycle_pb2


def _alice(lethe: Lethe) -> tuple[Client, dict[str, str]]:
    c = lethe.client("alice")
    t = create_thread(c, "alice", thread_id="t", title="first chat")
    said = append(c, t, ["I adopted a puppy", "its name is Biscuit", "forget me"], commit=True)
    (pending,) = append(c, t, ["still pending"])
    (expiring,) = append(c, t, ["about to expire"], ttl=1.0)
    answer = reply(c, t, "Biscuit is a fine name", [said[1].name])
    tainted = reply(c, t, "so you said: forget me", [said[2].name])
    fact = c.create_memory(
        "owners/alice",
        {"kind": "FACT", "text": "has a cat", "state": "COMMITTED", "slot": "pet"},
        memory_id="pet",
    )
    corrected = c.update_memory(
        {"name": fact.name, "text": "has a puppy"}, update_mask=["text"], expected_version=1
    )
    assert corrected.version == 2
    summary(c, "sum", "owns a puppy named Biscuit", [said[0].name, said[1].name])
    receipt = c.forget([said[2].name])
    r = create_thread(c, "alice", thread_id="r")
    append(c, r, ["fine", "something I regret saying"], commit=True)
    repair = c.seal_repair(r, from_seq=2)
    bob = lethe.client("bob")
    append(bob, create_thread(bob, "bob", thread_id="b"), ["bob's secret"], commit=True)
    time.sleep(1.1)  # the pending turn with a 1 s lifetime has expired (no sweeper runs)
    return c, {
        "pending": pending.name,
        "expiring": expiring.name,
        "answer": answer.name,
        "tainted": tainted.name,
        "forgotten": said[2].name,
        "receipt": receipt.name,
        "repair": repair.name,
    }


def test_an_export_holds_every_live_record_and_nothing_forgotten_expired_or_foreign(
    lethe: Lethe,
) -> None:
    c, n = _alice(lethe)
    items = list(c.export_owner("owners/alice"))
    kinds = [i.WhichOneof("item") for i in items]
    assert kinds[0] == "header"
    assert kinds[-1] == "summary"
    assert kinds.count("header") == kinds.count("summary") == 1
    header, summary_ = items[0].header, items[-1].summary
    assert header.owner == "owners/alice"
    assert header.store_id == c.get_server_info().store_id
    assert not header.include_sealed

    threads = [i.thread for i in items if i.HasField("thread")]
    assert [t.name for t in threads] == ["owners/alice/threads/r", "owners/alice/threads/t"]
    assert threads[1].title == "first chat"
    turns = {i.turn.name: i.turn for i in items if i.HasField("turn")}
    texts = sorted(t.text for t in turns.values())
    assert texts == sorted(
        [
            "I adopted a puppy",
            "its name is Biscuit",
            "still pending",
            "Biscuit is a fine name",
            "so you said: forget me",
            "fine",
        ]
    )
    assert turns[n["pending"]].state == common_pb2.PENDING
    assert turns[n["pending"]].HasField("expire_time")
    assert turns[n["tainted"]].tainted
    assert n["forgotten"] not in turns
    assert n["expiring"] not in turns  # expired: absent though no sweeper ran
    assert all(not t.embedding for t in turns.values())

    versions = [
        (i.memory.name, i.memory.version, i.memory.text) for i in items if i.HasField("memory")
    ]
    assert versions == [
        ("owners/alice/memories/pet", 1, "has a cat"),
        ("owners/alice/memories/pet", 2, "has a puppy"),
        ("owners/alice/memories/sum", 1, "owns a puppy named Biscuit"),
    ]
    old = next(i.memory for i in items if i.HasField("memory") and i.memory.version == 1)
    assert old.status == old.SUPERSEDED

    edges = {(i.edge.source.name, i.edge.derivative.name) for i in items if i.HasField("edge")}
    assert ("owners/alice/threads/t/turns/2", n["answer"]) in edges
    assert ("owners/alice/threads/t/turns/1", "owners/alice/memories/sum") in edges
    assert ("owners/alice/threads/t/turns/2", "owners/alice/memories/sum") in edges

    receipts = [i.receipt for i in items if i.HasField("receipt")]
    assert [r.name for r in receipts] == [n["receipt"]]
    keys = [k.public_key for k in c.get_server_info().receipt_keys]
    assert all(verify_receipt(r, keys) for r in receipts)

    assert (summary_.threads, summary_.turns, summary_.memory_versions) == (2, 6, 3)
    assert summary_.edges == len(edges) and summary_.receipts == 1  # noqa: PT018
    everything = b"".join(i.SerializeToString() for i in items)
    assert b"bob's secret" not in everything
    assert b"something I regret" not in everything  # sealed: not without include_sealed
    assert b"forget me" in everything  # only as the tainted response's own text
    assert b"about to expire" not in everything


def test_sealed_material_only_when_asked_for(lethe: Lethe) -> None:
    c, n = _alice(lethe)
    items = list(c.export_owner("owners/alice", include_sealed=True))
    assert items[0].header.include_sealed
    sealed = [i.turn for i in items if i.HasField("turn") and i.turn.state == common_pb2.SEALED]
    assert [t.text for t in sealed] == ["something I regret saying"]
    assert sealed[0].name == "owners/alice/threads/r/turns/2"
    threads = [i.thread.name for i in items if i.HasField("thread")]
    assert n["repair"] in threads
    assert items[-1].summary.turns == 7
    # Exporting does not reopen the repair.
    assert c.get_thread(n["repair"]).repair.state == c.get_thread(n["repair"]).repair.PAUSED


def test_another_owners_token_is_refused(lethe: Lethe) -> None:
    _alice(lethe)
    bob = lethe.client("bob")
    with pytest.raises(OwnerNotAllowed):
        list(bob.export_owner("owners/alice"))


def test_an_export_file_reads_back_to_the_same_items(lethe: Lethe, tmp_path: Path) -> None:
    c, _ = _alice(lethe)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "alice.jsonl"
    doc = export_owner(c, "alice", out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600  # it holds content in plaintext
    assert doc["turns"] == 6
    assert doc["memory_versions"] == 3
    assert doc["bytes"] == out.stat().st_size
    assert [p.name for p in out.parent.iterdir()] == ["alice.jsonl"]  # no temporary file left
    read = list(read_export(out))
    streamed = list(c.export_owner("owners/alice"))
    read[0].header.ClearField("export_time")
    streamed[0].header.ClearField("export_time")
    assert read == streamed
    # The lines written from the stream read back to the very same messages.
    copy = tmp_path / "copy.jsonl"
    copy.write_text("".join(export_line(i) + "\n" for i in streamed))
    assert list(read_export(copy)) == streamed


def test_a_cut_export_file_is_incomplete(lethe: Lethe, tmp_path: Path) -> None:
    c, _ = _alice(lethe)
    out = tmp_path / "alice.jsonl"
    export_owner(c, "alice", out)
    lines = out.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:-1]))
    with pytest.raises(IncompleteExport, match="before its summary"):
        list(read_export(cut))
    dropped = tmp_path / "dropped.jsonl"
    dropped.write_text("".join(line for line in lines if '"kind": "edge"' not in line))
    with pytest.raises(IncompleteExport, match="edge items"):
        list(read_export(dropped))
    assert isinstance(next(iter(read_export(out))), lifecycle_pb2.ExportItem)
