"""Echoes over gRPC: the sweep of a forget, its actions, and the guard that stands after it.

An echo repeats a forgotten text without declaring it: an assistant turn that
said the fact again with no ``context_refs``, a summary built with no
``sources``. Every test runs the real server on loopback.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import grpc
import pytest
from _helpers import append, create_thread, expect_error, search_texts, unique
from conftest import Client, Lethe

from lethe.client import EchoesForgotten, RecordDeleted
from lethe.v1 import common_pb2, lifecycle_pb2
from server.retrieval import echo_shingles
from shredder import KekRing, Keystore, RingRef

FAILED = grpc.StatusCode.FAILED_PRECONDITION


def _fact() -> str:
    """A distinctive planted fact (enough content words to be looked for), unique per call."""
    return (
        f"My grandmother's violin {unique('mark')} was made in Cremona in 1873 "
        "and it still carries her initials inside"
    )


def _said(c: Client, thread: str, fact: str) -> tuple[str, str]:
    """The fact said by the user, then repeated by the assistant with no lineage: their names."""
    turns = c.append_turns(
        thread,
        [
            {"role": "USER", "text": fact, "commit": True},
            {
                "role": "ASSISTANT",
                "text": f"What a treasure! {fact.replace('My', 'Your')}.",
                "commit": True,
            },
            {"role": "USER", "text": "Anyway, shall we plan the trip to Lisbon?", "commit": True},
        ],
    ).turns
    return turns[0].name, turns[1].name


def _summary(c: Client, fact: str, mid: str = "") -> str:
    """A summary with no sources that contains the fact verbatim among other things."""
    memory = {
        "kind": "SUMMARY",
        "text": f"Week summary: talked about work and the weather. {fact}. Then Lisbon plans.",
        "state": "COMMITTED",
    }
    return str(c.create_memory("owners/alice", memory, memory_id=mid).name)


def _visible(c: Client, thread: str, needle: str) -> bool:
    """Whether ``needle`` comes back through search (every mode) or context assembly."""
    found = ""
    for mode in ("HYBRID", "LEXICAL"):
        found += str(c.search("owners/alice", query_text=needle, top_k=50, mode=mode))
    found += str(c.assemble_context(thread, query_text=needle))
    return needle in found


# ---------------------------------------------------------------------- the sweep


def test_the_default_taints_an_undeclared_repetition_and_deletes_an_undeclared_summary(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said, repeated = _said(c, thread, fact)
    summary = _summary(c, fact, "week")
    marker = fact.split()[3]
    assert _visible(c, thread, marker)
    receipt = c.forget([said])
    assert receipt.echo_action == common_pb2.TAINT
    assert sorted(receipt.echoes) == sorted([repeated, summary])
    assert (receipt.echoes_found, receipt.echoes_acted, receipt.echo_texts) == (2, 2, 1)
    assert receipt.tainted == 0  # nothing declared lineage: these are echoes, not responses
    assert receipt.deleted == 2  # the turn and the summary
    assert receipt.HasField("echo_guard_expire_time")
    assert marker.encode() not in receipt.SerializeToString()
    assert c.get_turn(repeated).tainted
    with pytest.raises(RecordDeleted):
        c.get_memory(summary)
    assert not _visible(c, thread, marker)
    listed = c.list_deletions("owners/alice").receipts
    assert [r.echoes_found for r in listed] == [2]


def test_report_names_the_echoes_and_leaves_them(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said, repeated = _said(c, thread, fact)
    receipt = c.forget([said], echoes="REPORT")
    assert (receipt.echo_action, list(receipt.echoes)) == (common_pb2.REPORT, [repeated])
    assert (receipt.echoes_found, receipt.echoes_acted) == (1, 0)
    assert not receipt.HasField("echo_guard_expire_time")  # report sets no guard
    assert not c.get_turn(repeated).tainted
    assert c.get_turn(repeated).text in search_texts(c, "alice", fact.split()[3])


def test_forget_forgets_the_echoes_with_the_targets(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said, repeated = _said(c, thread, fact)
    summary = _summary(c, fact)
    receipt = c.forget([said], echoes="FORGET")
    assert (receipt.echoes_found, receipt.echoes_acted, receipt.deleted) == (2, 2, 3)
    with pytest.raises(RecordDeleted):
        c.get_turn(repeated)
    with pytest.raises(RecordDeleted):
        c.get_memory(summary)
    assert not _visible(c, thread, fact.split()[3])


def test_ignore_looks_for_nothing(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    said, repeated = _said(c, thread, _fact())
    receipt = c.forget([said], echoes="IGNORE")
    assert (receipt.echo_action, receipt.echoes_found, receipt.echo_texts) == (
        common_pb2.IGNORE,
        0,
        0,
    )
    assert not c.get_turn(repeated).tainted


def test_declared_lineage_is_not_an_echo(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said = append(c, thread, [fact], commit=True)[0]
    reply = c.append_turns(
        thread,
        [
            {
                "role": "ASSISTANT",
                "text": f"Noted: {fact}",
                "commit": True,
                "context_refs": [{"name": said.name, "version": 1}],
            }
        ],
    ).turns[0]
    receipt = c.forget([said.name])
    assert (receipt.tainted, receipt.echoes_found) == (1, 0)  # tainted by lineage
    assert c.get_turn(reply.name).tainted


def test_a_pending_repetition_in_the_same_thread_is_swept(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said = append(c, thread, [fact], commit=True)[0]
    pending = append(c, thread, [f"So: {fact}"])[0]
    receipt = c.forget([said.name])
    assert list(receipt.echoes) == [pending.name]
    assert c.get_turn(pending.name).tainted


def test_a_short_text_has_nothing_distinctive_to_look_for(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    said, again = append(c, thread, ["Yes, Biscuit!", "Yes, Biscuit!"], commit=True)
    receipt = c.forget([said.name])
    assert (receipt.echo_texts, receipt.echoes_found) == (0, 0)
    assert not receipt.HasField("echo_guard_expire_time")
    assert not c.get_turn(again.name).tainted


def test_another_owners_records_are_never_read_nor_guarded(lethe: Lethe) -> None:
    alice, bob = lethe.client("alice"), lethe.client("bob")
    fact = _fact()
    a_thread, b_thread = create_thread(alice, "alice"), create_thread(bob, "bob")
    said = append(alice, a_thread, [fact], commit=True)[0]
    bobs = append(bob, b_thread, [fact, f"Bob again: {fact}"], commit=True)
    receipt = alice.forget([said.name])
    assert receipt.echoes_found == 0
    assert all(not bob.get_turn(t.name).tainted for t in bobs)
    assert fact in search_texts(bob, "bob", fact.split()[3])
    later = append(bob, b_thread, [fact], commit=True)[0]  # alice's guard is alice's
    assert not later.tainted


def test_a_whole_owner_forget_looks_for_no_echo(lethe: Lethe) -> None:
    c = lethe.client("alice")
    _said(c, create_thread(c, "alice"), _fact())
    receipt = c.forget(["owners/alice"])
    assert receipt.echo_action == common_pb2.IGNORE
    assert lethe.server is not None
    assert lethe.server.store.echo_guards("alice") == []


def test_bad_echo_fields_are_refused(lethe: Lethe) -> None:
    c = lethe.client("alice")
    said = append(c, create_thread(c, "alice"), [_fact()], commit=True)[0]
    nine = lifecycle_pb2.ForgetRequest(names=[said.name])
    nine.echoes = 9  # type: ignore[assignment]  # not an EchoAction
    negative = lifecycle_pb2.ForgetRequest(names=[said.name])
    negative.echo_guard.seconds = -1
    too_long = lifecycle_pb2.ForgetRequest(names=[said.name])
    too_long.echo_guard.seconds = 400 * 86400
    for request, field in ((nine, "echoes"), (negative, "echo_guard"), (too_long, "echo_guard")):
        err = expect_error(
            c.lifecycle.Forget, request, c.md, grpc.StatusCode.INVALID_ARGUMENT, "BAD_FIELD"
        )
        assert field in str(err.details())
    assert not c.get_turn(said.name).tainted


# ---------------------------------------------------------------------- the guard


def test_inside_the_window_an_echoing_summary_is_refused_and_a_turn_born_tainted(
    lethe: Lethe,
) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said = append(c, thread, [fact], commit=True)[0]
    c.forget([said.name], echo_guard=3600)
    with pytest.raises(EchoesForgotten) as refused:
        _summary(c, fact)  # rebuilt by a job that read the history before the forget
    assert refused.value.code() == FAILED
    assert refused.value.subject == "memory.text"
    again = c.append_turns(
        thread, [{"role": "ASSISTANT", "text": f"As you said, {fact}", "commit": True}]
    ).turns[0]
    assert again.tainted
    assert not _visible(c, thread, fact.split()[3])
    other = append(c, thread, ["We booked the Lisbon hotel near the river today"], commit=True)
    assert not other[0].tainted
    assert lethe.server is not None
    assert lethe.server.store.echo_guard_hits == 2
    report = c.audit("owners/alice")  # a standing guard's key is no stray key
    assert (report.keys_without_record, report.records_without_key) == (0, 0)


def test_with_forget_the_guard_refuses_an_echoing_turn(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said = append(c, thread, [fact], commit=True)[0]
    c.forget([said.name], echoes="FORGET")
    with pytest.raises(EchoesForgotten) as refused:
        append(c, thread, ["fine", f"Again: {fact}"], commit=True)
    assert refused.value.subject == "turns[1].text"
    assert [t.text for t in c.iter_turns(thread)] == []  # the whole append was refused


def test_a_pending_echo_elsewhere_is_caught_at_its_commit(lethe: Lethe) -> None:
    c = lethe.client("alice")
    fact = _fact()
    here, there = create_thread(c, "alice"), create_thread(c, "alice")
    said = append(c, here, [fact], commit=True)[0]
    waiting = append(c, there, [f"Remember: {fact}"])[0]  # pending, in another thread
    summary = c.create_memory("owners/alice", {"kind": "SUMMARY", "text": fact})  # pending
    receipt = c.forget([said.name])
    assert receipt.echoes_found == 0  # not swept: pending, elsewhere
    committed = c.commit([waiting.name])
    assert [r.name for r in committed.committed] == [waiting.name]
    assert c.get_turn(waiting.name).tainted
    with pytest.raises(EchoesForgotten) as refused:
        c.commit([summary.name])
    assert refused.value.subject == summary.name


def test_a_zero_window_sets_no_guard(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said = append(c, thread, [fact], commit=True)[0]
    receipt = c.forget([said.name], echo_guard=0)
    assert not receipt.HasField("echo_guard_expire_time")
    assert not append(c, thread, [fact], commit=True)[0].tainted


def _files_holding(root: Path, needles: list[bytes]) -> list[str]:
    """The files under ``root`` that hold any of ``needles``."""
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    return [str(p) for p in files if any(n in p.read_bytes() for n in needles)]


def test_after_the_window_the_guard_key_is_shredded_and_no_copy_matches(
    tmp_path: Path, kek_env: str, lethe_at: object
) -> None:
    server = lethe_at(tmp_path / "data", sweep_interval=0.1)  # type: ignore[operator]
    c = server.client("alice")
    thread = create_thread(c, "alice")
    fact = _fact()
    said = append(c, thread, [fact], commit=True)[0]
    c.forget([said.name], echo_guard=1.0)
    store = server.server.store
    (guard,) = store.echo_guards("alice")
    ring = RingRef("alice", None)
    shingles = echo_shingles(fact)
    assert len(shingles) >= 5
    digests = store.keystore.keyed_digests(ring, guard.key_id, shingles)
    assert [k.key_id for k in store.echo_keys("alice")] == [guard.key_id]
    deadline = time.time() + 30
    while store.echo_guards() and time.time() < deadline:
        time.sleep(0.1)
    assert (store.echo_guards(), store.echo_keys()) == ([], [])
    assert store.keystore.shredded_at(ring, guard.key_id) is not None  # the shred log
    assert not store.keystore.has_record_key(ring, guard.key_id)
    assert store.unrotated_since() is not None  # the next rotation renews the owner's ring
    assert not append(c, thread, [fact], commit=True)[0].tainted  # the window is over
    server.stop()
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "data", copy)
    # LMDB does not zero freed pages: the deleted rows' digests may linger in the
    # copy's free pages, but the key that made them is gone, so they match
    # nothing the copy can compute (below). Shingles were never stored in the clear.
    assert len(digests) == len(shingles)
    assert _files_holding(copy, list(shingles)) == []
    # No key left in the copied keystore digests a forgotten shingle into any byte of the copy.
    ks = Keystore(copy / "keystore", KekRing.from_env(kek_env), map_size=1 << 26)
    try:
        keys = list(ks.list_record_keys("alice"))
        assert (ring, guard.key_id) not in keys
        made = [d for r, k in keys for d in ks.keyed_digests(r, k, shingles)]
    finally:
        ks.close()
    assert _files_holding(copy, made) == []


def test_guards_of_one_bucket_share_a_key_and_its_digest_rows(lethe: Lethe) -> None:
    c = lethe.client("alice")
    thread = create_thread(c, "alice")
    first = _fact()
    second = "Her grandmother's violin was made in Cremona and the bow came from Paris in 1901"
    said = append(c, thread, [first, second], commit=True)  # a few bigrams in common
    assert c.forget([said[0].name], echo_guard=3600).echoes_found == 0
    c.forget([said[1].name], echo_guard=3600)
    assert lethe.server is not None
    store = lethe.server.store
    one, two = store.echo_guards("alice")
    assert one.key_id == two.key_id  # one key per bucket: no keystore write per forget
    assert len(store.echo_keys("alice")) == 1
    digests = store.env.open_db(b"echo_digests")
    with store.env.begin() as txn:
        values = [bytes(v) for _, v in txn.cursor(db=digests)]
    # One row per distinct bigram of the bucket, listing every guard text holding it:
    # a write is digested once per bucket, whatever the number of guards.
    shared = [v for v in values if len(v) == 24]
    assert shared
    assert all({v[:8].hex(), v[12:20].hex()} == {one.guard_id, two.guard_id} for v in shared)
    assert append(c, thread, [second], commit=True)[0].tainted
    assert append(c, thread, [first], commit=True)[0].tainted
