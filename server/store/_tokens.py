"""Bearer tokens (API.md, "Authentication"): creating, listing, revoking and reading them.

They are kept in the ``tokens`` table.

A token is stored only as its 32-byte SHA-256 digest (the key) with a
:class:`TokenRow` (the value, JSON). A token's id is the hex of the first 8
bytes of that digest: it names the token in ``lethe token list`` and
``lethe token revoke`` and in logs, and cannot be turned back into the token
(a 64-bit prefix of a SHA-256 output of 256 random bits). Rows written before
ids, labels and expiry existed read as labelless, never-expiring tokens.

Revocation keeps the row with its ``revoke_time`` (so the list still shows
it); the server reads the row on every call and once a second for every open
stream, so revocation and expiry take effect on a running server without a
restart — tokens may be written by another process (``lethe token``) while
the server runs.

Thread rules: as every part of :class:`server.store.Store`; writes go through
the writer.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lmdb

from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._writer import WriteOp

TOKEN_ID_BYTES = 8
"""Bytes of the digest prefix that make a token's id (16 hex characters)."""
DIGEST_BYTES = 32
"""Bytes of a token's SHA-256 digest, the key of its row in the ledger and the copy."""
LEDGER_FILLED = b"!filled"
"""The ledger's marker: the tokens of the data's copy were moved into the ledger once."""


@dataclass(slots=True)
class TokenReconcile:
    """What :meth:`TokensPart.reconcile_tokens` changed in the data's copy of the tokens.

    Attributes:
        migrated: tokens copied into the ledger the first time (a store written
            before the ledger existed); nothing else is done that time.
        restored: ids of tokens the ledger holds and the copy lacked (created
            after a restored backup): written back.
        revoked: ids of tokens revoked in the ledger that the copy still had
            active (revoked after a restored backup): revoked again.
        updated: other rows of the copy rewritten to the ledger's.
        removed: ids of tokens of the copy the ledger does not hold (they left
            with an owner's move): removed.
    """

    migrated: int = 0
    restored: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    updated: int = 0
    removed: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One log line: counts and token ids only."""
        if self.migrated:
            return f"{self.migrated} tokens moved into the keystore's ledger"
        return (
            f"tokens: {len(self.restored)} restored, {len(self.revoked)} revoked again, "
            f"{self.updated} updated, {len(self.removed)} removed"
        )


@dataclass(frozen=True, slots=True)
class TokenRow:
    """What a token may do, and when it stops.

    Attributes:
        id: 16 hex characters, the first 8 bytes of the token's digest.
        owners: owner ids the token may act for.
        admin: acts for every owner.
        create_time: seconds since the epoch.
        label: operator's name for it (an id-like string, not encrypted).
        expire_time: seconds since the epoch after which it is refused; 0 never.
        revoke_time: seconds since the epoch it was revoked; 0 if it was not.
    """

    id: str
    owners: tuple[str, ...]
    admin: bool
    create_time: float
    label: str = ""
    expire_time: float = 0.0
    revoke_time: float = 0.0

    def active(self, now: float) -> bool:
        """Whether the token authenticates at ``now`` (seconds since the epoch).

        It does when neither revoked nor expired. The one place that decides
        it.
        """
        if self.revoke_time:
            return False
        return not (self.expire_time and now >= self.expire_time)

    def record(self) -> dict[str, Any]:
        """The stored JSON object (without the id, which the key gives)."""
        return {
            "owners": list(self.owners),
            "admin": self.admin,
            "create_time": self.create_time,
            "label": self.label,
            "expire_time": self.expire_time,
            "revoke_time": self.revoke_time,
        }

    @classmethod
    def decode(cls, digest: bytes, raw: bytes) -> TokenRow:
        data = json.loads(raw)
        return cls(
            id=token_id(digest),
            owners=tuple(data.get("owners", [])),
            admin=bool(data.get("admin")),
            create_time=float(data.get("create_time", 0.0)),
            label=str(data.get("label", "")),
            expire_time=float(data.get("expire_time", 0.0)),
            revoke_time=float(data.get("revoke_time", 0.0)),
        )


def owner_tokens(entries: Iterable[tuple[bytes, bytes]], owner: str) -> list[bytes]:
    """Digests of the token rows among ``entries`` that act for ``owner`` alone (not admin).

    The tokens an owner move takes with the owner (its export reads the same rule).
    """
    out = []
    for digest, raw in entries:
        if len(digest) != DIGEST_BYTES:
            continue
        row = TokenRow.decode(digest, raw)
        if row.owners == (owner,) and not row.admin:
            out.append(digest)
    return out


def token_id(digest: bytes) -> str:
    """The id of the token stored under ``digest`` (16 hex characters)."""
    return digest[:TOKEN_ID_BYTES].hex()


class TokensPart(StoreBase):
    """Token operations of :class:`server.store.Store` (see the module docstring)."""

    def _ledger_filled(self) -> bool:
        return self.keystore.ledger_entry(LEDGER_FILLED) is not None

    def _ledger_tokens(self) -> dict[bytes, bytes]:
        """Every token row of the ledger: digest → JSON (the marker left out)."""
        return {k: v for k, v in self.keystore.ledger() if len(k) == DIGEST_BYTES}

    def create_token(
        self,
        digest: bytes,
        owners: Sequence[str],
        admin: bool,
        *,
        label: str = "",
        expire_time: float = 0.0,
    ) -> TokenRow:
        """Store a new token's digest with what it may do (the ledger, then the data's copy).

        Args:
            digest: 32-byte SHA-256 digest of the token.
            owners: owner ids it may act for (ignored order, no duplicates kept).
            admin: acts for every owner.
            label: the operator's name for it.
            expire_time: seconds since the epoch when it stops working; 0 never.

        Returns:
            The stored row.

        Raises:
            ValueError: ``digest`` is not 32 bytes, or a token with the same id
                exists (two tokens whose digests share 64 bits: practically never).
            StoreFull, Unavailable: it could not be written (the ledger's row is
                removed again; the token does not work).
        """
        if len(digest) != DIGEST_BYTES:
            raise ValueError("a token digest is 32 bytes")
        row = TokenRow(
            token_id(digest),
            tuple(sorted(set(owners))),
            admin,
            time.time(),
            label,
            expire_time,
        )
        if self._token_by_id(row.id) is not None:
            raise ValueError(f"token id {row.id} is taken")
        raw = json.dumps(row.record()).encode()

        def apply(txn: lmdb.Transaction) -> TokenRow:
            txn.put(digest, raw, db=self.t.tokens)
            return row

        try:
            return self.writer.run(
                WriteOp(apply, ledger=self._filled([(digest, raw)]), name="token.create")
            )
        except BaseException:
            with contextlib.suppress(Exception):  # best effort; start-up reconciles
                self.keystore.put_ledger([(digest, None)])
            raise

    def put_token(self, digest: bytes, principal: dict[str, Any]) -> None:
        """Store a token digest with a principal record ``{"owners", "admin"}``.

        The record as :func:`server.principal_record` makes it; see
        :meth:`create_token`.
        """
        self.create_token(
            digest,
            principal.get("owners", []),
            bool(principal.get("admin")),
            label=str(principal.get("label", "")),
            expire_time=float(principal.get("expire_time", 0.0)),
        )

    def get_token(self, digest: bytes) -> TokenRow | None:
        """The row stored under a token digest, or None.

        Revoked and expired rows are included: ask :meth:`TokenRow.active`.
        """
        raw = self.keystore.ledger_entry(digest)
        if raw is None and not self._ledger_filled():  # a store the ledger never saw
            with self.env.begin() as txn:
                raw = sk.get(txn, self.t.tokens, digest)
        return None if raw is None else TokenRow.decode(digest, raw)

    def get_principal(self, digest: bytes) -> dict[str, Any] | None:
        """The stored record of a token digest as a dict, or None."""
        row = self.get_token(digest)
        return None if row is None else row.record()

    def tokens(self) -> list[TokenRow]:
        """Every stored token (revoked and expired ones too), oldest first."""
        rows = [TokenRow.decode(k, v) for k, v in self._all_tokens().items()]
        return sorted(rows, key=lambda r: (r.create_time, r.id))

    def revoke_token(self, token_id_: str) -> TokenRow | None:
        """Revoke the token with id ``token_id_`` (16 hex characters).

        The ledger is written first (synced): from then on the token is refused,
        whatever happens to the data's copy.

        Returns:
            The row as revoked (an already revoked token keeps its first
            ``revoke_time``), or None when no token has that id.

        Raises:
            StoreFull, Unavailable: it could not be written.
        """
        found = self._token_by_id(token_id_)
        if found is None:
            return None
        digest, row = found
        if not row.revoke_time:
            row = TokenRow(
                row.id,
                row.owners,
                row.admin,
                row.create_time,
                row.label,
                row.expire_time,
                time.time(),
            )
        raw = json.dumps(row.record()).encode()

        def apply(txn: lmdb.Transaction) -> TokenRow:
            txn.put(digest, raw, db=self.t.tokens)
            return row

        return self.writer.run(
            WriteOp(apply, ledger=self._filled([(digest, raw)]), name="token.revoke")
        )

    def reconcile_tokens(self) -> TokenReconcile:
        """Bring the data's copy of the tokens in line with the ledger (start-up, restore).

        A store written before the ledger existed fills the ledger from the copy
        first. Then every token of the ledger is written into the copy where it
        is missing or differs (a token created after the restored backup, a
        revocation the backup predates), and every token of the copy the ledger
        does not hold is removed (it left with its owner's move since).

        Returns:
            What changed.

        Raises:
            StoreFull, Unavailable: the copy could not be written (the ledger,
                which every read uses, is not affected).
        """
        with self.env.begin() as txn:
            copy = {bytes(k): bytes(v) for k, v in sk.scan(txn, self.t.tokens, b"")}
        if not self._ledger_filled():
            moved = TokenReconcile(migrated=len(copy))
            filled = [*copy.items(), (LEDGER_FILLED, b"1")]
            return self.writer.run(
                WriteOp(lambda txn: moved, ledger=filled, name="tokens.reconcile")
            )
        ledger = self._ledger_tokens()
        restored = [d for d in ledger if d not in copy]
        revoked = [
            d
            for d in ledger
            if d in copy
            and TokenRow.decode(d, ledger[d]).revoke_time
            and not TokenRow.decode(d, copy[d]).revoke_time
        ]
        changed = [d for d in ledger if d in copy and copy[d] != ledger[d] and d not in revoked]
        removed = [d for d in copy if d not in ledger]
        result = TokenReconcile(
            restored=[token_id(d) for d in restored],
            revoked=[token_id(d) for d in revoked],
            updated=len(changed),
            removed=[token_id(d) for d in removed],
        )
        if not (restored or revoked or changed or removed):
            return result

        def apply(txn: lmdb.Transaction) -> TokenReconcile:
            for digest in (*restored, *revoked, *changed):
                txn.put(digest, ledger[digest], db=self.t.tokens)
            for digest in removed:
                txn.delete(digest, db=self.t.tokens)
            return result

        return self.writer.run(WriteOp(apply, name="tokens.reconcile"))

    def _all_tokens(self) -> dict[bytes, bytes]:
        """Every token row, digest → JSON: the ledger's, or the copy's before it is filled."""
        if self._ledger_filled():
            return self._ledger_tokens()
        with self.env.begin() as txn:
            return {bytes(k): bytes(v) for k, v in sk.scan(txn, self.t.tokens, b"")}

    def _filled(self, items: list[tuple[bytes, bytes | None]]) -> list[tuple[bytes, bytes | None]]:
        """``items`` for the ledger, with the migration of the copy when it is not filled yet."""
        if self._ledger_filled():
            return items
        with self.env.begin() as txn:
            copy = [(bytes(k), bytes(v)) for k, v in sk.scan(txn, self.t.tokens, b"")]
        return [*copy, *items, (LEDGER_FILLED, b"1")]

    def _token_by_id(self, id_: str) -> tuple[bytes, TokenRow] | None:
        try:
            prefix = bytes.fromhex(id_)
        except ValueError:
            return None
        if len(prefix) != TOKEN_ID_BYTES:
            return None
        for digest, raw in self._all_tokens().items():
            if digest.startswith(prefix):
                return digest, TokenRow.decode(digest, raw)
        return None
