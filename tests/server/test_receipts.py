"""Signed deletion receipts through the real server.

Every receipt the server returns (``Forget``, ``ListDeletions``,
``ConcludeRepair``, the ``RECORD_DELETED`` event) names the store and is signed
by its key, which ``GetServerInfo`` publishes; a tampered receipt, or one
checked against another store's keys, does not verify; after a rotation of the
signing key (server stopped) the old receipts still verify and new ones are
signed by the new key.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _helpers import append, create_thread
from conftest import Lethe

from lethe.receipts import InvalidReceipt, verify_receipt
from lethe.v1 import common_pb2, lifecycle_pb2


def _keys(info: lifecycle_pb2.ServerInfo) -> list[bytes]:
    return [key.public_key for key in info.receipt_keys]


def _forgotten(lethe: Lethe) -> tuple[common_pb2.DeletionReceipt, lifecycle_pb2.ServerInfo]:
    c = lethe.client("alice")
    thread = create_thread(c, "alice", thread_id="t")
    turn, _ = append(c, thread, ["my bank PIN is 4921", "keep this"], commit=True)
    return c.forget([turn.name], reason="asked"), c.get_server_info()


def test_a_forget_receipt_names_the_store_and_verifies_with_its_published_key(
    lethe: Lethe,
) -> None:
    receipt, info = _forgotten(lethe)
    assert lethe.server is not None
    assert info.store_id == lethe.server.store.store_id
    assert len(info.store_id) == 32
    [key] = info.receipt_keys
    assert len(key.public_key) == 32
    assert not key.HasField("retire_time")
    assert key.create_time.seconds > 0
    assert receipt.store_id == info.store_id
    assert receipt.signing_key_id == key.key_id
    assert len(receipt.signature) == 64
    assert verify_receipt(receipt, _keys(info)) == key.key_id
    assert b"4921" not in receipt.SerializeToString()  # never content


@pytest.mark.parametrize(
    "tamper",
    [
        lambda r: setattr(r, "deleted", r.deleted + 1),
        lambda r: r.targets.append("owners/alice/threads/t/turns/2"),
        lambda r: r.shred_horizon_time.FromSeconds(r.shred_horizon_time.seconds + 3600),
        lambda r: r.request_time.FromSeconds(r.request_time.seconds - 86400),
        lambda r: setattr(r, "store_id", "0" * 32),
        lambda r: setattr(r, "reason", "EXPIRED"),
        lambda r: r.destinations[0].ClearField("complete_time"),
        lambda r: setattr(r, "signature", bytes(64)),
    ],
    ids=[
        "deleted",
        "targets",
        "horizon",
        "request-time",
        "store",
        "reason",
        "destination",
        "signature",
    ],
)
def test_a_tampered_receipt_does_not_verify(
    lethe: Lethe, tamper: Callable[[common_pb2.DeletionReceipt], object]
) -> None:
    receipt, info = _forgotten(lethe)
    altered = common_pb2.DeletionReceipt()
    altered.CopyFrom(receipt)
    tamper(altered)
    assert altered != receipt
    with pytest.raises(InvalidReceipt, match="does not match"):
        verify_receipt(altered, _keys(info))


def test_another_stores_keys_and_an_unsigned_receipt_do_not_verify(
    lethe: Lethe, lethe_at: Callable[..., Lethe]
) -> None:
    receipt, _ = _forgotten(lethe)
    other = lethe_at(lethe.data_dir.parent / "other")
    other_info = other.client("bob").get_server_info()
    assert other_info.store_id != receipt.store_id
    with pytest.raises(InvalidReceipt, match="not among the public keys"):
        verify_receipt(receipt, _keys(other_info))
    unsigned = common_pb2.DeletionReceipt()
    unsigned.CopyFrom(receipt)
    unsigned.ClearField("signature")
    with pytest.raises(InvalidReceipt, match="no signature"):
        verify_receipt(unsigned, _keys(other_info))


def test_every_receipt_the_server_returns_is_signed(lethe: Lethe) -> None:
    c = lethe.client("alice")
    keys = _keys(c.get_server_info())
    thread = create_thread(c, "alice", thread_id="t")
    turns = append(c, thread, ["one", "two", "three"], commit=True)
    stream = c.watch("owners/alice", types=["RECORD_DELETED"], timeout=30)
    forgot = c.forget([turns[0].name])
    repair = c.seal_repair(thread, from_seq=2)
    concluded = c.conclude_repair(repair.name, outcome="DESTROY").receipt
    listed = list(c.iter_deletions("owners/alice"))
    event = next(iter(stream))
    stream.close()
    assert [r.name for r in listed] == [forgot.name, concluded.name]
    assert event.receipt.name == forgot.name
    for receipt in [forgot, concluded, *listed, event.receipt]:
        assert verify_receipt(receipt, keys)
    assert listed[0] == forgot  # the same receipt, signed the same way, when listed again


def test_after_a_key_rotation_old_receipts_still_verify_and_new_ones_use_the_new_key(
    lethe: Lethe,
) -> None:
    receipt, before = _forgotten(lethe)
    lethe.stop()
    from server.store import Store

    store = Store(lethe.data_dir)
    try:
        new, old = store.keystore.rotate_signing_key()
    finally:
        store.close()
    assert old == receipt.signing_key_id
    lethe.start()
    c = lethe.client("alice")
    after = c.get_server_info()
    assert [k.key_id for k in after.receipt_keys] == [old, new]
    assert after.receipt_keys[0].HasField("retire_time")
    assert not after.receipt_keys[1].HasField("retire_time")
    assert after.receipt_keys[0].public_key == before.receipt_keys[0].public_key
    assert verify_receipt(receipt, _keys(after)) == old
    with pytest.raises(InvalidReceipt):
        verify_receipt(receipt, [after.receipt_keys[1].public_key])  # the new key alone
    thread = create_thread(c, "alice", thread_id="u")
    (turn,) = append(c, thread, ["later"], commit=True)
    fresh = c.forget([turn.name])
    assert verify_receipt(fresh, _keys(after)) == new
    relisted = next(iter(c.iter_deletions("owners/alice")))
    assert relisted.name == receipt.name
    assert verify_receipt(relisted, _keys(after)) == new  # listed now: signed by the key of now
