"""Echoes of forgotten texts: what the sweep reads, and the guard that outlives the forget.

A forget with an echo action (API.md, ``Forget``; ``server.lifecycle`` runs the
sweep) reads the texts it is about to forget
(:meth:`server.store._forget.ForgetPart.forget_texts`)
while their keys still exist, and the records the sweep found are acted on in
the plan's own transaction (:mod:`server.store._forget`). This module keeps the
*guard* that stands after it: for a window, a write whose text echoes a forgotten
text is refused or stored tainted.

What the guard keeps is never the text. Each forget with a guard has a guard key
of its own, a record key in the owner's ring (``echo-<guard id>``) made in the
keystore phase of the plan's write group; the guard's rows in the data
environment hold only keyed digests (BLAKE2b, 32 bytes, under that key:
:meth:`shredder.Keystore.keyed_digests`) of the forgotten texts' word shingles,
and how many a write must share with each text. A row cannot be turned back into
text, nor used to confirm a guess, without the key; when the window ends the
sweeper destroys the key (logged in the keystore's shred log; the next rotation
completes it for keystore copies) and then deletes the rows
(:meth:`EchoPart.expire_guard`), so nothing derived from the forgotten text
remains. A crash between the two leaves rows whose key is gone: useless, and
deleted by the next sweep; a guard key whose rows never committed (a crash in
the plan's group) is a key no row names, destroyed at start-up like any other.

Rows (layouts in :mod:`server.store._schema`):

- ``echo_guards``: ``owner 0x00 guard id`` -> :class:`GuardRow` JSON (ids, times,
  counts);
- ``echo_digests``: ``owner 0x00 guard id 0x00 digest`` -> the indexes (uint32
  big-endian each) of the guard's texts that hold the shingle.

A write checks every live guard of its owner (:meth:`EchoPart._echo_check`, in
the write's own transaction on the writer thread, so a write that commits after
the forget's plan always meets its guard): its text's shingles (the caller's
``shingler``, from ``server.retrieval``) are digested under each guard's key and
looked up; it echoes a forgotten text when it holds at least that text's
``need`` of them.

Thread rules: as every part of :class:`server.store.Store`.
"""

from __future__ import annotations

import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import lmdb

from server.errors import FailedPrecondition, Reason
from server.store import _json
from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._records import TurnMeta
from server.store._writer import WriteOp
from shredder import KeyNotFoundError, RingRef

ECHO_REPORT = "REPORT"
ECHO_TAINT = "TAINT"
ECHO_FORGET = "FORGET"
ECHO_IGNORE = "IGNORE"
ECHO_ACTIONS = (ECHO_REPORT, ECHO_TAINT, ECHO_FORGET, ECHO_IGNORE)
"""What a forget does to its echoes (``lethe.v1.EchoAction``)."""

Shingler = Callable[[str], Sequence[bytes]]
"""A text's distinct word shingles as bytes (``server.retrieval.echo_shingles``)."""

_INDEX = struct.Struct(">I")


def guard_key_id(guard_id: str) -> str:
    """The key id of a guard's key in its owner's ring."""
    return f"echo-{guard_id}"


def is_guard_key(ring: RingRef, key_id: str) -> bool:
    """Whether a record key is an echo guard's (an owner-ring key named ``echo-…``)."""
    return ring.thread is None and key_id.startswith("echo-")


@dataclass(frozen=True, slots=True)
class GuardPlan:
    """The guard a forget sets, as the lifecycle hands it to the plan.

    Attributes:
        guard_id: random hex; names the guard's rows and its key.
        expire_time: when the window ends (seconds since the epoch).
        action: ``TAINT`` or ``FORGET`` (what a later echoing write gets).
        shingles: per forgotten text looked for, its distinct word shingles.
        need: per text, how many of them a write must hold to echo it.
    """

    guard_id: str
    expire_time: float
    action: str
    shingles: tuple[tuple[bytes, ...], ...]
    need: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EchoSweep:
    """What the echo sweep of one forget found, and what to do (``server.lifecycle``).

    Attributes:
        action: ``REPORT``, ``TAINT`` or ``FORGET``.
        echoes: record numbers of the records whose text echoes a forgotten
            text (turns or memories of the owner); the plan acts on those still
            live and outside the forget's declared lineage.
        texts: forgotten texts looked for (those with distinctive content).
        guard: the guard to set, or None.
    """

    action: str
    echoes: tuple[int, ...] = ()
    texts: int = 0
    guard: GuardPlan | None = None

    def guard_key(self, owner: str) -> list[tuple[RingRef, str]]:
        """The key the plan's write group creates for the guard (none without one)."""
        if self.guard is None:
            return []
        return [(RingRef(owner, None), guard_key_id(self.guard.guard_id))]


@dataclass(slots=True)
class GuardRow:
    """One guard's header row (ids, times and counts only).

    Attributes:
        owner, guard_id, deletion: whose, which, and the forget that set it.
        key_id: its key in the owner's ring.
        expire_time: when the window ends (seconds).
        action: ``TAINT`` or ``FORGET``.
        need: per forgotten text, the shingles a write must share with it.
    """

    owner: str
    guard_id: str
    deletion: str
    key_id: str
    expire_time: float
    action: str
    need: list[int] = field(default_factory=list)

    def encode(self) -> bytes:
        return _json.dumps(
            {
                "owner": self.owner,
                "guard_id": self.guard_id,
                "deletion": self.deletion,
                "key_id": self.key_id,
                "expire_time": self.expire_time,
                "action": self.action,
                "need": self.need,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> GuardRow:
        data = _json.loads(raw)
        return cls(
            str(data["owner"]),
            str(data["guard_id"]),
            str(data["deletion"]),
            str(data["key_id"]),
            float(data["expire_time"]),
            str(data["action"]),
            [int(n) for n in data.get("need", [])],
        )


def _noop(txn: lmdb.Transaction) -> None:
    del txn


class EchoPart(StoreBase):
    """The forgotten texts a sweep reads, and the echo guard (see the module docstring)."""

    # The guarded writes refused or tainted since start (``lethe_echo_guard_hits_total``).
    echo_guard_hits: int = 0

    # ------------------------------------------------------------------ setting a guard

    def _install_guard(
        self, txn: lmdb.Transaction, owner: str, deletion_id: str, guard: GuardPlan
    ) -> None:
        """Write a guard's rows in the plan's transaction (its key exists: the group made it).

        Raises:
            KeyNotFoundError: the guard key is missing (never, in the plan's group).
        """
        key_id = guard_key_id(guard.guard_id)
        ring = RingRef(owner, None)
        prefix = sk.echo_digest_prefix(owner, guard.guard_id)
        held: dict[bytes, list[int]] = {}
        for index, shingles in enumerate(guard.shingles):
            for digest in self.keystore.keyed_digests(ring, key_id, shingles):
                held.setdefault(digest, []).append(index)
        for digest, indexes in held.items():
            txn.put(
                prefix + digest,
                b"".join(_INDEX.pack(i) for i in indexes),
                db=self.t.echo_digests,
            )
        row = GuardRow(
            owner,
            guard.guard_id,
            deletion_id,
            key_id,
            guard.expire_time,
            guard.action,
            list(guard.need),
        )
        txn.put(sk.echo_guard_key(owner, guard.guard_id), row.encode(), db=self.t.echo_guards)

    # ------------------------------------------------------------------ checking writes

    def _live_guards(self, txn: lmdb.Transaction, owner: str, now: float) -> list[GuardRow]:
        """The owner's guards whose window has not ended (one cursor position when none)."""
        rows = sk.scan(txn, self.t.echo_guards, sk.owner_prefix(owner))
        return [g for g in (GuardRow.decode(raw) for _, raw in rows) if g.expire_time > now]

    def _echo_check(
        self,
        txn: lmdb.Transaction,
        owner: str,
        texts: Sequence[str],
        shingler: Shingler | None,
        guards: Sequence[GuardRow] | None = None,
    ) -> list[str]:
        """What the owner's live guards say of each text: ``""``, ``TAINT`` or ``FORGET``.

        Runs in the write's transaction. Without a live guard (the usual case)
        it reads one cursor position and never calls ``shingler``. ``guards``:
        :meth:`_live_guards` when the caller has them.
        """
        verdicts = [""] * len(texts)
        if shingler is None or not texts:
            return verdicts
        if guards is None:
            guards = self._live_guards(txn, owner, time.time())
        if not guards:
            return verdicts
        sets = [list(dict.fromkeys(shingler(text))) for text in texts]
        every = list(dict.fromkeys(s for one in sets for s in one))
        ring = RingRef(owner, None)
        for guard in guards:
            try:
                made = self.keystore.keyed_digests(ring, guard.key_id, every)
            except KeyNotFoundError:  # destroyed; its rows go with the next sweep
                continue
            digests = dict(zip(every, made, strict=True))
            prefix = sk.echo_digest_prefix(owner, guard.guard_id)
            for j, shingles in enumerate(sets):
                counts: Counter[int] = Counter()
                for shingle in shingles:
                    raw = sk.get(txn, self.t.echo_digests, prefix + digests[shingle])
                    if raw is not None:
                        counts.update(i for (i,) in _INDEX.iter_unpack(raw))
                need = guard.need
                hit = any(n >= need[i] for i, n in counts.items() if i < len(need))
                if hit and verdicts[j] != ECHO_FORGET:
                    verdicts[j] = guard.action
        return verdicts

    def _refuse_echo(self, subject: str) -> FailedPrecondition:
        """The refusal of a write that echoes forgotten text (counted as a guard hit)."""
        self.echo_guard_hits += 1
        return FailedPrecondition(
            f"{subject} echoes a text forgotten within the echo guard's window",
            reason=Reason.ECHOES_FORGOTTEN,
            subject=subject,
        )

    def _taint_echo(self, meta: TurnMeta) -> None:
        """Store a guarded turn born tainted (counted as a guard hit)."""
        self.echo_guard_hits += 1
        meta.tainted = True

    # ------------------------------------------------------------------ the window's end

    def echo_guards(self, owner: str | None = None) -> list[GuardRow]:
        """Every guard row (of ``owner``, or of every owner), live or past its window."""
        prefix = b"" if owner is None else sk.owner_prefix(owner)
        with self.env.begin() as txn:
            return [GuardRow.decode(raw) for _, raw in sk.scan(txn, self.t.echo_guards, prefix)]

    def expire_guard(self, row: GuardRow) -> None:
        """End a guard: destroy its key (synced, in the shred log), then delete its rows.

        One write op (``echo.expire``): the keystore phase destroys the key, the
        data transaction deletes the rows. Repeating it after a crash between
        the two is harmless (destroying a missing key is not an error).
        """

        def apply(txn: lmdb.Transaction) -> None:
            self._drop_guard_rows(txn, row.owner, row.guard_id)

        self.writer.run(
            WriteOp(
                apply,
                destroy_keys=[(RingRef(row.owner, None), row.key_id)],
                name="echo.expire",
            )
        )

    def _drop_guard_rows(self, txn: lmdb.Transaction, owner: str, guard_id: str) -> None:
        txn.delete(sk.echo_guard_key(owner, guard_id), db=self.t.echo_guards)
        sk.delete_prefix(txn, self.t.echo_digests, sk.echo_digest_prefix(owner, guard_id))

    def _drop_owner_guards(self, txn: lmdb.Transaction, owner: str) -> None:
        """Delete every guard row of an owner forgotten whole (its ring took the keys)."""
        sk.delete_prefix(txn, self.t.echo_guards, sk.owner_prefix(owner))
        sk.delete_prefix(txn, self.t.echo_digests, sk.owner_prefix(owner))

    def guard_count(self) -> int:
        """Guards standing (``lethe_echo_guard_keys``: each holds one live key until it ends)."""
        with self.env.begin() as txn:
            return int(txn.stat(self.t.echo_guards)["entries"])


def guard_keys_in(
    txn: lmdb.Transaction, tables: Any, owner: str | None = None
) -> set[tuple[RingRef, str]]:
    """The keys the guard rows name (of ``owner``, or of every owner): in use, never stray."""
    prefix = b"" if owner is None else sk.owner_prefix(owner)
    rows = (GuardRow.decode(raw) for _, raw in sk.scan(txn, tables.echo_guards, prefix))
    return {(RingRef(g.owner, None), g.key_id) for g in rows}
