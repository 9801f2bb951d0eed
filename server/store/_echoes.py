"""Echoes of forgotten texts: what the sweep reads, and the guard that outlives the forget.

A forget with an echo action (API.md, ``Forget``; ``server.lifecycle`` runs the
sweep) reads the texts it is about to forget
(:meth:`server.store._forget.ForgetPart.forget_texts`)
while their keys still exist, and the records the sweep found are acted on in
the plan's own transaction (:mod:`server.store._forget`). This module keeps the
*guard* that stands after it: for a window, a write whose text echoes a forgotten
text is refused or stored tainted.

What the guard keeps is never the text. Its rows in the data environment hold
only keyed digests (BLAKE2b, 32 bytes: :meth:`shredder.Keystore.keyed_digests`)
of the forgotten texts' word shingles, and how many a write must share with
each text. A row cannot be turned back into text, nor used to confirm a guess,
without the key. The guards of one bucket share its key and its digest rows (a
row lists every guard and text holding the shingle), so a write is digested
once per bucket whatever the number of guards; the price is that a reader of
the data sees that two texts forgotten within one bucket had a shingle in
common, never which.

The keys: guards end at the boundary of a *bucket* of time (:func:`guard_bucket`:
a power of two seconds, about a sixteenth of the window asked for, so a window
is kept at least as long as asked and at most an eighth longer), and the guards
of one owner that end at the same boundary share one key in the owner's ring,
``echo-<bucket seconds>-<end>``, made once (:meth:`EchoPart.ensure_guard_key`,
its own write op ``echo.key``: the keystore, then an ``echo_keys`` row naming it)
— so a forget adds no keystore write of its own but the first of its bucket.
When the bucket ends the sweeper (and start-up) destroys the key — synced, in
the keystore's shred log; the next rotation completes it for keystore copies —
and then deletes the key's row and every guard row under it
(:meth:`EchoPart.expire_guard_key`), so nothing derived from the forgotten texts
remains that anything can be linked with. A crash between the two leaves rows
whose key is gone: useless, deleted by the next start or sweep; a key made
without its row (a crash in ``echo.key``) is a key no row names, destroyed at
start-up like any other.

Rows (layouts in :mod:`server.store._schema`):

- ``echo_keys``: ``owner 0x00 key id`` -> :class:`GuardKeyRow` JSON (its end);
- ``echo_guards``: ``owner 0x00 key id 0x00 guard id`` -> :class:`GuardRow` JSON
  (ids, times, counts);
- ``echo_digests``: ``owner 0x00 key id 0x00 digest`` -> one 12-byte entry per
  guard text holding the shingle: the guard's id (8 bytes), the text's index
  (uint32 big-endian).

A write checks every live guard of its owner (:meth:`EchoPart._echo_check`, in
the write's own transaction on the writer thread, so a write that commits after
the forget's plan always meets its guard): its text's shingles (the caller's
``shingler``, from ``server.retrieval``) are digested under each guard's key and
looked up once per bucket; it echoes a forgotten text when it holds at least
that text's ``need`` of them.

Thread rules: as every part of :class:`server.store.Store`.
"""

from __future__ import annotations

import math
import struct
import threading
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
from server.store._records import PENDING, TurnMeta
from server.store._visibility import effective_state
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
_ENTRY = 8 + _INDEX.size
"""Bytes of one entry of a digest row: the guard's id (8 bytes), the text's index."""


GUARD_BUCKETS = 16
"""About how many buckets a guard's window spans (:func:`guard_bucket`)."""


def guard_bucket(window: float) -> float:
    """The bucket of a guard's window (seconds): the power of two nearest above ``window / 16``.

    At least 1 s. A guard asked for ``window`` ends at the first bucket boundary
    after it, so it stands at least ``window`` and less than ``window`` plus one
    bucket (an eighth of the window at most, beyond 16 s).
    """
    return float(2 ** max(0, math.ceil(math.log2(max(window, 1e-9) / GUARD_BUCKETS))))


def guard_end(now: float, window: float) -> tuple[float, str]:
    """When a guard set at ``now`` for ``window`` seconds ends, and the id of its bucket's key."""
    bucket = guard_bucket(window)
    end = math.ceil((now + window) / bucket) * bucket
    return end, f"echo-{int(bucket)}-{int(end)}"


@dataclass(frozen=True, slots=True)
class GuardPlan:
    """The guard a forget sets, as the lifecycle hands it to the plan.

    Attributes:
        guard_id: 16 random hex digits; names the guard's rows.
        expire_time: when the window ends (seconds since the epoch; a bucket
            boundary, :func:`guard_end`).
        key_id: the key of its bucket (:meth:`EchoPart.ensure_guard_key` made it).
        action: ``TAINT`` or ``FORGET`` (what a later echoing write gets).
        shingles: per forgotten text looked for, its distinct word shingles.
        need: per text, how many of them a write must hold to echo it.
    """

    guard_id: str
    expire_time: float
    key_id: str
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


@dataclass(slots=True)
class GuardKeyRow:
    """A guard key's row: whose, which, and when its bucket ends (seconds)."""

    owner: str
    key_id: str
    expire_time: float

    def encode(self) -> bytes:
        return _json.dumps({"owner": self.owner, "key_id": self.key_id, "end": self.expire_time})

    @classmethod
    def decode(cls, raw: bytes) -> GuardKeyRow:
        data = _json.loads(raw)
        return cls(str(data["owner"]), str(data["key_id"]), float(data["end"]))


class EchoPart(StoreBase):
    """The forgotten texts a sweep reads, and the echo guard (see the module docstring)."""

    # The guarded writes refused or tainted since start (``lethe_echo_guard_hits_total``).
    echo_guard_hits: int = 0
    # Held while a guard bucket's key is looked up and made (:meth:`ensure_guard_key`);
    # one for the process (stores opened side by side share it: it is held briefly).
    _guard_key_lock = threading.Lock()

    # ------------------------------------------------------------------ the sweep's reads

    def recent_pending(
        self, owner: str, threads: Sequence[str], window: int
    ) -> list[tuple[TurnMeta, str]]:
        """The live, untainted pending turns among the last ``window`` turns of each thread.

        With their plain text (``speaker: text``), decrypted: the pending turns
        an echo sweep looks at (they are in no index the sweep reads). Reads
        ``window`` rows per thread, never the whole thread.
        """
        now = time.time()
        rows: list[tuple[TurnMeta, dict[str, bytes]]] = []
        with self.env.begin() as txn:
            for thread in threads:
                tmeta = self._thread_row(txn, owner, thread)
                if tmeta is None or tmeta.deleted:
                    continue
                lo = max(1, tmeta.last_seq - window + 1)
                for meta in self._thread_metas(txn, owner, thread, lo=lo):
                    if meta.tainted or effective_state(meta, now) != PENDING:
                        continue
                    rows.append((meta, self._read_payloads(txn, meta.rid, with_embedding=False)))

        def plain(meta: TurnMeta, cts: dict[str, bytes]) -> tuple[TurnMeta, str]:
            view = self.turn_view(meta, cts, with_embedding=False)
            return meta, f"{view.speaker}: {view.text}" if view.speaker else view.text

        return self.open_each(rows, plain)

    # ------------------------------------------------------------------ setting a guard

    def _install_guard(
        self, txn: lmdb.Transaction, owner: str, deletion_id: str, guard: GuardPlan
    ) -> bool:
        """Write a guard's rows in the plan's transaction.

        Returns:
            Whether the guard was set: not when its bucket's key is already gone
            (a window so short that its bucket ended while the forget was
            planned: there is nothing left to guard).
        """
        key_id = guard.key_id
        ring = RingRef(owner, None)
        prefix = sk.echo_digest_prefix(owner, key_id)
        me = bytes.fromhex(guard.guard_id)
        held: dict[bytes, list[int]] = {}
        try:
            for index, shingles in enumerate(guard.shingles):
                for digest in self.keystore.keyed_digests(ring, key_id, shingles):
                    held.setdefault(digest, []).append(index)
        except KeyNotFoundError:
            return False
        for digest, indexes in held.items():
            entries = b"".join(me + _INDEX.pack(i) for i in indexes)
            before = sk.get(txn, self.t.echo_digests, prefix + digest) or b""
            txn.put(prefix + digest, before + entries, db=self.t.echo_digests)
        row = GuardRow(
            owner,
            guard.guard_id,
            deletion_id,
            key_id,
            guard.expire_time,
            guard.action,
            list(guard.need),
        )
        txn.put(
            sk.echo_guard_key(owner, key_id, guard.guard_id), row.encode(), db=self.t.echo_guards
        )
        return True

    # ------------------------------------------------------------------ checking writes

    def _live_keys(self, txn: lmdb.Transaction, owner: str, now: float) -> list[GuardKeyRow]:
        """The owner's guard buckets not yet ended (one cursor position when there is none)."""
        rows = sk.scan(txn, self.t.echo_keys, sk.owner_prefix(owner))
        return [k for k in (GuardKeyRow.decode(raw) for _, raw in rows) if k.expire_time > now]

    def _echo_check(
        self,
        txn: lmdb.Transaction,
        owner: str,
        texts: Sequence[str],
        shingler: Shingler | None,
        keys: Sequence[GuardKeyRow] | None = None,
    ) -> list[str]:
        """What the owner's live guards say of each text: ``""``, ``TAINT`` or ``FORGET``.

        Runs in the write's transaction. Without a live guard (the usual case)
        it reads one cursor position and never calls ``shingler``. The text's
        shingles are digested once per bucket (not per guard) and looked up;
        only the guards they hit are read. ``keys``: :meth:`_live_keys` when
        the caller has them.
        """
        verdicts = [""] * len(texts)
        if shingler is None or not texts:
            return verdicts
        if keys is None:
            keys = self._live_keys(txn, owner, time.time())
        if not keys:
            return verdicts
        sets = [list(dict.fromkeys(shingler(text))) for text in texts]
        every = list(dict.fromkeys(s for one in sets for s in one))
        ring = RingRef(owner, None)
        for key in keys:
            try:
                made = self.keystore.keyed_digests(ring, key.key_id, every)
            except KeyNotFoundError:  # destroyed; its rows go with the next sweep
                continue
            digests = dict(zip(every, made, strict=True))
            prefix = sk.echo_digest_prefix(owner, key.key_id)
            guards: dict[bytes, GuardRow | None] = {}
            for j, shingles in enumerate(sets):
                counts: Counter[tuple[bytes, int]] = Counter()
                for shingle in shingles:
                    raw = sk.get(txn, self.t.echo_digests, prefix + digests[shingle])
                    for k in range(0, len(raw or b""), _ENTRY):
                        entry = (raw or b"")[k : k + _ENTRY]
                        counts[(entry[:8], _INDEX.unpack(entry[8:])[0])] += 1
                for (gid, index), n in counts.items():
                    if gid not in guards:
                        found = sk.get(
                            txn, self.t.echo_guards, sk.echo_guard_key(owner, key.key_id, gid.hex())
                        )
                        guards[gid] = None if found is None else GuardRow.decode(found)
                    guard = guards[gid]
                    if guard is None or index >= len(guard.need) or n < guard.need[index]:
                        continue
                    if verdicts[j] != ECHO_FORGET:
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

    # ------------------------------------------------------------------ the keys

    def ensure_guard_key(self, owner: str, key_id: str, expire_time: float) -> None:
        """Make the key of a guard bucket (and its ``echo_keys`` row) if it is not there yet.

        One write op (``echo.key``): the keystore phase makes the key, the data
        transaction the row. Serialised per store, so two forgets of one bucket
        never both make it.
        """
        ring = RingRef(owner, None)
        with self._guard_key_lock:
            with self.env.begin() as txn:
                if sk.get(txn, self.t.echo_keys, sk.echo_key_key(owner, key_id)) is not None:
                    return
            row = GuardKeyRow(owner, key_id, expire_time)

            def apply(txn: lmdb.Transaction) -> None:
                txn.put(sk.echo_key_key(owner, key_id), row.encode(), db=self.t.echo_keys)

            self.writer.run(
                WriteOp(apply, owner=owner, create_keys=[(ring, key_id)], name="echo.key")
            )

    def echo_guards(self, owner: str | None = None) -> list[GuardRow]:
        """Every guard row (of ``owner``, or of every owner), live or past its window."""
        prefix = b"" if owner is None else sk.owner_prefix(owner)
        with self.env.begin() as txn:
            return [GuardRow.decode(raw) for _, raw in sk.scan(txn, self.t.echo_guards, prefix)]

    def echo_keys(self, owner: str | None = None) -> list[GuardKeyRow]:
        """Every guard key row (of ``owner``, or of every owner)."""
        prefix = b"" if owner is None else sk.owner_prefix(owner)
        with self.env.begin() as txn:
            return [GuardKeyRow.decode(raw) for _, raw in sk.scan(txn, self.t.echo_keys, prefix)]

    def expire_guard_key(self, row: GuardKeyRow) -> int:
        """End a bucket: destroy its key (synced, in the shred log), then delete its rows.

        One write op (``echo.expire``): the keystore phase destroys the key, the
        data transaction deletes the key's row and every guard (with its
        digests) under it. Repeating it after a crash between the two is
        harmless (destroying a missing key is not an error).

        Returns:
            How many guards ended.
        """

        def apply(txn: lmdb.Transaction) -> int:
            txn.delete(sk.echo_key_key(row.owner, row.key_id), db=self.t.echo_keys)
            prefix = sk.echo_digest_prefix(row.owner, row.key_id)  # the bucket's rows
            ended = sum(1 for _ in sk.scan_keys(txn, self.t.echo_guards, prefix))
            sk.delete_prefix(txn, self.t.echo_guards, prefix)
            sk.delete_prefix(txn, self.t.echo_digests, prefix)
            return ended

        return self.writer.run(
            WriteOp(
                apply,
                destroy_keys=[(RingRef(row.owner, None), row.key_id)],
                name="echo.expire",
            )
        )

    def _drop_owner_guards(self, txn: lmdb.Transaction, owner: str) -> None:
        """Delete every guard row of an owner forgotten whole (its ring took the keys)."""
        for db in (self.t.echo_keys, self.t.echo_guards, self.t.echo_digests):
            sk.delete_prefix(txn, db, sk.owner_prefix(owner))

    def guard_count(self) -> int:
        """Guard keys live (``lethe_echo_guard_keys``), one per owner and bucket."""
        with self.env.begin() as txn:
            return int(txn.stat(self.t.echo_keys)["entries"])


def guard_keys_in(
    txn: lmdb.Transaction, tables: Any, owner: str | None = None
) -> set[tuple[RingRef, str]]:
    """The guard keys the data names (of ``owner``, or of every owner): in use, never stray."""
    prefix = b"" if owner is None else sk.owner_prefix(owner)
    keys = (GuardKeyRow.decode(raw) for _, raw in sk.scan(txn, tables.echo_keys, prefix))
    guards = (GuardRow.decode(raw) for _, raw in sk.scan(txn, tables.echo_guards, prefix))
    named = {(g.owner, g.key_id) for g in keys} | {(g.owner, g.key_id) for g in guards}
    return {(RingRef(owner_id, None), key_id) for owner_id, key_id in named}
