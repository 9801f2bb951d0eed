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

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lmdb

from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._writer import WriteOp

TOKEN_ID_BYTES = 8
"""Bytes of the digest prefix that make a token's id (16 hex characters)."""


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


def token_id(digest: bytes) -> str:
    """The id of the token stored under ``digest`` (16 hex characters)."""
    return digest[:TOKEN_ID_BYTES].hex()


class TokensPart(StoreBase):
    """Token operations of :class:`server.store.Store`."""

    def create_token(
        self,
        digest: bytes,
        owners: Sequence[str],
        admin: bool,
        *,
        label: str = "",
        expire_time: float = 0.0,
    ) -> TokenRow:
        """Store a new token's digest with what it may do.

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
        """
        if len(digest) != 32:
            raise ValueError("a token digest is 32 bytes")
        row = TokenRow(
            token_id(digest),
            tuple(sorted(set(owners))),
            admin,
            time.time(),
            label,
            expire_time,
        )

        def apply(txn: lmdb.Transaction) -> TokenRow:
            if self._token_by_id(txn, row.id) is not None:
                raise ValueError(f"token id {row.id} is taken")
            txn.put(digest, json.dumps(row.record()).encode(), db=self.t.tokens)
            return row

        return self.writer.run(WriteOp(apply))

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
        with self.env.begin() as txn:
            raw = sk.get(txn, self.t.tokens, digest)
        return None if raw is None else TokenRow.decode(digest, raw)

    def get_principal(self, digest: bytes) -> dict[str, Any] | None:
        """The stored record of a token digest as a dict, or None."""
        row = self.get_token(digest)
        return None if row is None else row.record()

    def tokens(self) -> list[TokenRow]:
        """Every stored token (revoked and expired ones too), oldest first."""
        with self.env.begin() as txn:
            rows = [TokenRow.decode(key, raw) for key, raw in sk.scan(txn, self.t.tokens, b"")]
        return sorted(rows, key=lambda r: (r.create_time, r.id))

    def revoke_token(self, token_id_: str) -> TokenRow | None:
        """Revoke the token with id ``token_id_`` (16 hex characters).

        Returns:
            The row as revoked (an already revoked token keeps its first
            ``revoke_time``), or None when no token has that id.
        """

        def apply(txn: lmdb.Transaction) -> TokenRow | None:
            found = self._token_by_id(txn, token_id_)
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
                txn.put(digest, json.dumps(row.record()).encode(), db=self.t.tokens)
            return row

        return self.writer.run(WriteOp(apply))

    def _token_by_id(self, txn: lmdb.Transaction, id_: str) -> tuple[bytes, TokenRow] | None:
        try:
            prefix = bytes.fromhex(id_)
        except ValueError:
            return None
        if len(prefix) != TOKEN_ID_BYTES:
            return None
        for key, raw in sk.scan(txn, self.t.tokens, prefix):
            return key, TokenRow.decode(key, raw)
        return None
