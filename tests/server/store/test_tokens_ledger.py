"""Tokens live in the keystore's ledger; the data keeps a copy, reconciled at start-up.

White-box: a store written before the ledger existed (its tokens only in the data's
``tokens`` table) serves them from the copy, then the first reconcile fills the ledger;
after that every read is the ledger's, and the copy follows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from server import new_token, token_digest
from server.store import Store
from server.store._tokens import LEDGER_FILLED


@pytest.fixture
def store(tmp_path: Path, kek_env: str) -> Iterator[Store]:
    s = Store(tmp_path / "d")
    yield s
    s.close()


def _old_row(owner: str) -> bytes:
    return json.dumps({"owners": [owner], "admin": False, "create_time": 1.0}).encode()


def test_a_store_from_before_the_ledger_moves_its_tokens_into_it_once(store: Store) -> None:
    digest = token_digest(new_token())
    with store.env.begin(write=True) as txn:  # as a store written before the ledger
        txn.put(digest, _old_row("alice"), db=store.t.tokens)
    assert store.keystore.ledger() == []
    found = store.get_token(digest)
    assert found is not None
    assert found.owners == ("alice",)  # served from the copy until the ledger is filled
    assert store.reconcile_tokens().migrated == 1
    assert dict(store.keystore.ledger()) == {digest: _old_row("alice"), LEDGER_FILLED: b"1"}
    assert store.reconcile_tokens().migrated == 0  # once
    revoked = store.revoke_token(digest[:8].hex())
    assert revoked is not None
    assert revoked.revoke_time > 0
    ledger_row = store.get_token(digest)
    assert ledger_row is not None
    assert ledger_row.revoke_time == revoked.revoke_time


def test_the_copy_follows_the_ledger(store: Store) -> None:
    kept = token_digest(new_token())
    store.create_token(kept, ["alice"], False)
    stale = token_digest(new_token())
    with store.env.begin(write=True) as txn:  # in the copy only: the ledger let it go
        txn.put(stale, _old_row("bob"), db=store.t.tokens)
        txn.delete(kept, db=store.t.tokens)
    assert store.get_token(stale) is None  # reads are the ledger's
    result = store.reconcile_tokens()
    assert (result.restored, result.removed) == ([kept[:8].hex()], [stale[:8].hex()])
    with store.env.begin() as txn:
        assert txn.get(stale, db=store.t.tokens) is None
        assert txn.get(kept, db=store.t.tokens) is not None
    assert store.reconcile_tokens().restored == []
