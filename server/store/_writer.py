"""The single writer thread and its group commit.

LMDB write transactions are bound to the thread that began them, and one
environment has one writer at a time, so every write to the data environment
and to the keystore runs on the one thread this module owns. Callers on any
thread ``submit`` a :class:`WriteOp` and wait on its future; the writer takes
every op already queued (up to ``max_batch``) and runs them as one group:

1. one keystore transaction, synced, writing the group's ledger records
   (``WriteOp.ledger``: rows a restore must never roll back, such as tokens),
   then one creating every record key the group needs (keys exist before any
   ciphertext that refers to them);
2. one keystore transaction, synced, destroying every key the group
   destroys (crypto-shredding);
3. one data-environment write transaction in which each op's ``apply`` runs
   in its own nested transaction, so an op that raises is rolled back alone
   and its future gets the exception, while the others commit together;
4. the record keys made for ops that failed are destroyed again, and so are
   the keys an op that committed reports it did not use (``WriteOp.unused``);
5. ``on_commit`` (if given) runs once the data transaction has committed,
   before any future resolves (the store announces new events with it).

Storage faults fail closed and whole: a group whose data transaction does not
fit in the map (``MapFullError``) is retried op by op, so each op either
commits whole or fails alone with ``STORE_FULL``. Deletions have room the
other ops do not (:mod:`server.store._reserve`): past ``--max-store-size`` the
other ops are refused before they run while deletions use the map's reserve,
and a deletion refused for want of disk space frees the disk reserve and runs
again, alone; a disk error (ENOSPC, EIO)
fails the group with ``UNAVAILABLE``; in both cases the keys made for the
failed ops are destroyed and moved keys are moved back. When that clean-up
cannot write either (the disk is still full), what it left undone is kept and
tried again before each later group and whenever :meth:`Writer.tidy` asks (the
sweeper does, every sweep), so once space returns the keys go without a
restart (start-up would destroy them too, as keys no record uses).

Failpoints (:mod:`shredder._failpoints`, for the crash tests): every op has a
``name``; ``<name>.after_keystore`` is reached after the group's keystore
transactions committed and before its data transaction, ``<name>.after_commit``
after the data transaction committed and before the caller is answered, and
``writer.before_commit`` inside the data transaction (inject a disk error).

Thread rules: ``submit`` from any thread; ``apply`` callables run only on the
writer thread; ``close`` from the thread that owns the Writer.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import lmdb

from server.errors import StoreFull, Unavailable
from server.store._reserve import ESSENTIAL
from shredder import FreshKeys, Keystore, RingRef, declare, failpoint

T = TypeVar("T")
_log = logging.getLogger(__name__)

FP_BEFORE_COMMIT = declare(
    "writer.before_commit",
    "a group's ops ran in its data transaction, which is not committed yet",
)

OPERATIONS = {
    "write": "an unnamed write",
    "thread.create": "CreateThread (a ring and title key, then the thread row)",
    "append": "AppendTurns with its tagger candidates (record keys, then the turns)",
    "commit": "Commit",
    "extend": "ExtendPending",
    "retention.set": "SetRetention of turns, memories or threads (their rows and queues)",
    "retention.owner": "SetRetention of an owner's default (its row)",
    "expiry.warn": "the sweeper's PENDING_EXPIRING announcements",
    "memory.create": "CreateMemory (a record key, then the memory)",
    "memory.update": "UpdateMemory, a correction",
    "memory.transition": "TransitionMemory",
    "memory.batch": "BatchUpdateMemories (a record key per request, then every memory)",
    "slot.key": "creating an owner's slot-digest key",
    "snapshot.key": "creating an owner's index-snapshot key (before its first snapshot)",
    "commitments.due": "the scheduler's COMMITMENT_DUE announcements",
    "forget.plan": "step 1 of a forget: tombstones, cascade and the deletion-log entry",
    "forget.finish": "steps 3-4 of a forget: keys destroyed, then rows purged",
    "echo.key": "the key of an echo guard bucket (the keystore, then its row)",
    "echo.expire": "the end of an echo guard bucket: its key destroyed, then its guards' rows",
    "seal": "SealRepair (record keys moved to the repair's ring, then the data)",
    "repair.state": "ReopenRepair, PauseRepair, PRESERVE_RESTRICTED",
    "repair.conclude": "ConcludeRepair DESTROY / DISTILL: lesson, conclusion and step 1",
    "event": "an event outside any other write",
    "events.prune": "pruning events past their retention",
    "manifest": "storing a context manifest",
    "keys.destroy_stray": "destroying keys no record uses (start-up, restore, unused snapshot key)",
    "keys.relocate": "moving keys back to the ring their records name (start-up)",
    "embedder.record": "recording a changed embedder at start (owners stamped with the old one)",
    "reembed": "replacing all of one owner's vectors by the new embedder's, in one transaction",
    "rotation": "rotation (renew rings, move ring keys to a new KEK version)",
    "owner.import": "an owner move's import: every row of the owner, renumbered",
    "owner.purge": "an owner move's release (or a dropped import): the owner's rows removed",
    "token.create": "lethe token create, shard token-import (the ledger, then the data's copy)",
    "token.revoke": "lethe token revoke (the ledger, then the data's copy)",
    "tokens.reconcile": "start-up: the data's copy of the tokens brought in line with the ledger",
}
"""Every named write op; each has the failpoints ``<name>.after_keystore`` and
``<name>.after_commit``."""
for _name, _what in OPERATIONS.items():
    declare(f"{_name}.after_keystore", f"{_what}: keystore committed, data not")
    declare(f"{_name}.after_commit", f"{_what}: data committed, caller not answered")


def _spent(txn: lmdb.Transaction) -> Any:
    """The ``apply`` of an op that has run (:meth:`Writer.run`); never called."""
    raise AssertionError("a WriteOp ran twice")


@dataclass
class WriteOp(Generic[T]):
    """One unit of work for the writer.

    Attributes:
        apply: Runs on the writer thread inside a nested write transaction of
            the data environment; its return value resolves the future.
        create_keys: (ring, key id) record keys to create before ``apply``.
        destroy_keys: record keys to destroy (before ``apply``).
        destroy_rings: rings to destroy with all their record keys.
        destroy_owners: owners whose every ring is destroyed.
        rewrap_keys, rewrap_to: record keys to move into ring ``rewrap_to``
            before ``apply`` (sealing into a repair); moved back if ``apply`` fails.
        name: the operation, for failpoints and logs (``append``, ``seal``, …).
        owner: the owner a client's write is for; the writer's guard refuses it
            inside the data transaction while the owner is marked moved away
            (so a write that passed the authorisation check before the marker
            landed cannot commit after it). "" for internal work (sweeps,
            purges, rotation), which is never refused.
        unused: record keys ``apply`` reports it made no record for (it may
            append to this list); destroyed once the group has committed.
        ledger: ``(key, value or None to delete)`` records of the keystore's
            ledger (:meth:`shredder.Keystore.put_ledger`), written before ``apply``
            and kept even if ``apply`` fails: the ledger is the authority, and
            start-up brings the data's copy in line with it.
        essential: a write that must go on at the store's ceiling and on a full
            disk: the steps of a deletion (every op named in :data:`ESSENTIAL`)
            and what adds nothing but a marker (an owner's placement). It may
            use the reserves (:mod:`server.store._reserve`).
    """

    apply: Callable[[lmdb.Transaction], T]
    create_keys: Sequence[tuple[RingRef, str]] = ()
    destroy_keys: Sequence[tuple[RingRef, str]] = ()
    destroy_rings: Sequence[RingRef] = ()
    destroy_owners: Sequence[str] = ()
    rewrap_keys: Sequence[tuple[RingRef, str]] = ()
    rewrap_to: RingRef | None = None
    name: str = "write"
    owner: str = ""
    unused: list[tuple[RingRef, str]] = field(default_factory=list)
    ledger: Sequence[tuple[bytes, bytes | None]] = ()
    essential: bool = False
    future: Future[T] = field(default_factory=Future)

    def __post_init__(self) -> None:
        if self.name not in OPERATIONS:
            raise ValueError(f"undeclared write op {self.name!r}")
        if self.name in ESSENTIAL:
            self.essential = True


class Writer:
    """Owns the writer thread; see the module docstring.

    Args:
        env: The data environment.
        keystore: The keystore (its write methods are called only here).
        max_batch: Most ops grouped into one transaction.
        on_commit: called on the writer thread after each committed data
            transaction (must not block or raise).
        guard: called in each op's nested transaction, before ``apply``, with
            the op's ``owner`` (when set); what it raises fails that op alone.
        ceiling_reached: whether the store has reached ``--max-store-size``:
            then the group's ops but the deletions (:data:`ESSENTIAL`) are
            refused with ``STORE_FULL`` before they run.
        release_reserve: frees the disk reserve; returns the bytes freed. A
            deletion refused for want of disk space is run again, alone, once
            it freed some (:mod:`server.store._reserve`).
        on_begin: called on the writer thread as each data transaction begins.
        before_commit: called on the writer thread with each data transaction
            once its ops ran, just before it commits (the store writes its
            change log with it); what it raises fails the whole group.
    """

    def __init__(
        self,
        env: lmdb.Environment,
        keystore: Keystore,
        *,
        max_batch: int = 256,
        on_commit: Callable[[], None] | None = None,
        guard: Callable[[lmdb.Transaction, str], None] | None = None,
        ceiling_reached: Callable[[], bool] | None = None,
        release_reserve: Callable[[], int] | None = None,
        on_begin: Callable[[], None] | None = None,
        before_commit: Callable[[lmdb.Transaction], None] | None = None,
    ) -> None:
        self._on_begin = on_begin
        self._before_commit = before_commit
        self._ceiling_reached = ceiling_reached
        self._release_reserve = release_reserve
        self._env = env
        self._guard = guard
        self._keystore = keystore
        self._max_batch = max_batch
        self._on_commit = on_commit
        self._queue: queue.SimpleQueue[WriteOp[Any] | _Tidy | None] = queue.SimpleQueue()
        # Clean-up a storage fault left undone (writer thread only): record keys
        # made for ops that never committed, and keys to move back to their rings.
        self._undiscarded: list[tuple[RingRef, str]] = []
        self._unmoved: list[tuple[RingRef, RingRef, list[str]]] = []
        self._thread = threading.Thread(target=self._run, name="lethe-writer", daemon=True)
        self._closed = False
        # The record keys the running group created (writer thread only): payloads
        # of the group are sealed with them instead of unwrapping each again.
        self.fresh: FreshKeys | None = None
        self.batches = 0
        self.ops = 0
        # What a caller of run() waits for its group's commit inside: the
        # server lends the waiting call's running slot (server._steps.blocking).
        self.waiting: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext
        self._thread.start()

    def submit(self, op: WriteOp[T]) -> Future[T]:
        """Queue ``op``; the future resolves after its group has committed.

        Raises:
            RuntimeError: the writer is closed.
        """
        if self._closed:
            raise RuntimeError("writer is closed")
        self._queue.put(op)
        return op.future

    def run(self, op: WriteOp[T]) -> T:
        """Submit ``op`` and wait for its result (re-raising its exception).

        Once it is answered ``op`` lets go of its ``apply``: an ``apply`` that
        refers to its own op (to append to ``unused``) makes a reference
        cycle, which would keep everything the closure holds (an append's
        turn texts and vectors) until the cyclic collector's next full pass,
        and make that pass longer (a pause of every thread).
        """
        try:
            future = self.submit(op)
            with self.waiting():
                return future.result()
        finally:
            op.apply = _spent

    def tidy(self) -> None:
        """Ask the writer thread to retry the clean-up a storage fault left undone.

        Returns at once; the retry runs between groups. Does nothing once closed.
        """
        if not self._closed:
            self._queue.put(_TIDY)

    def leftovers(self) -> int:
        """Record keys and moved-key sets whose clean-up a storage fault left undone."""
        return len(self._undiscarded) + len(self._unmoved)

    def close(self) -> None:
        """Finish every queued op, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                break
            self._retry_cleanup()
            if isinstance(first, _Tidy):
                continue
            batch: list[WriteOp[Any]] = [first]
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                if isinstance(nxt, _Tidy):
                    continue
                batch.append(nxt)
            try:
                self._run_batch(batch)
            except Exception as exc:  # the thread must outlive any one group
                _log.exception("write group failed outside its transactions")
                for op in batch:
                    if not op.future.done():
                        op.future.set_exception(_storage_error(exc))

    def _retry_cleanup(self) -> None:
        """Try again what :meth:`_discard_keys` and :meth:`_unwrap_back` could not write."""
        if self._unmoved:
            moves, self._unmoved = self._unmoved, []
            self._move_back(moves, retry=True)
        if self._undiscarded:
            refs, self._undiscarded = self._undiscarded, []
            self._discard_keys(refs, retry=True)

    def _run_batch(self, batch: list[WriteOp[Any]]) -> None:
        live = [op for op in batch if op.future.set_running_or_notify_cancel()]
        if live and self._ceiling_reached is not None:
            live = self._refuse_past_ceiling(live)
        if not live:
            return
        results, keys_written = self._run_group(live)
        retry = [
            op
            for op, ok, value in results
            if not ok and op.essential and isinstance(value, Unavailable)
        ]
        if retry and self._release_reserve is not None and self._release_reserve():
            # A deletion refused for want of disk space: with the reserve freed, undo
            # what its first attempt did in the keystore, and run it again, alone.
            if keys_written:
                self._undo_keystore(retry)
            again, keys_again = self._run_group(retry)
            by_op = {id(op): (op, ok, value) for op, ok, value in again}
            results = [by_op.get(id(op), (op, ok, value)) for op, ok, value in results]
            keys_written = keys_written and keys_again
        if keys_written:
            committed = [op for op, ok, _ in results if ok]
            self._discard_keys(
                [ref for op, ok, _ in results if not ok for ref in op.create_keys]
                + [ref for op in committed for ref in op.unused]
            )
            for op, ok, _ in results:
                if not ok and op.rewrap_keys and op.rewrap_to is not None:
                    self._unwrap_back(op)
        for op, ok, value in results:
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)

    def _refuse_past_ceiling(self, live: list[WriteOp[Any]]) -> list[WriteOp[Any]]:
        """Fail the group's growth ops with ``STORE_FULL`` when the ceiling is reached.

        Returns:
            The ops that may run: all of them below the ceiling; the deletions
            (:data:`ESSENTIAL`, which may use the map reserve) past it.
        """
        if all(op.essential for op in live):
            return live
        assert self._ceiling_reached is not None
        if not self._ceiling_reached():
            return live
        for op in live:
            if not op.essential:
                op.future.set_exception(
                    StoreFull("the store is full: it has reached --max-store-size")
                )
        return [op for op in live if op.essential]

    def _undo_keystore(self, ops: list[WriteOp[Any]]) -> None:
        """Take back what ``ops``' failed attempt created and moved in the keystore."""
        self._discard_keys([ref for op in ops for ref in op.create_keys])
        for op in ops:
            if op.rewrap_keys and op.rewrap_to is not None:
                self._unwrap_back(op)

    def _run_group(
        self, live: list[WriteOp[Any]]
    ) -> tuple[list[tuple[WriteOp[Any], bool, Any]], bool]:
        """Run ``live`` as one group: keystore transactions, then one data transaction.

        Returns:
            ``(op, committed, value or exception)`` per op, and whether the keystore
            phase was written (when it was not, the whole group failed with it).
        """
        try:
            self._keystore_phase(live)
        except Exception as exc:  # keystore failure fails the whole group
            _log.error("keystore write failed: %s", type(exc).__name__)
            return [(op, False, _storage_error(exc)) for op in live], False
        try:
            for name in dict.fromkeys(op.name for op in live):
                failpoint(f"{name}.after_keystore")
            results = self._data_phase(live)
        except lmdb.MapFullError:
            # The group does not fit: each op alone commits whole or fails alone.
            results = []
            for op in live:
                try:
                    results.extend(self._data_phase([op]))
                except Exception as exc:
                    results.append((op, False, _storage_error(exc)))
        except Exception as exc:
            _log.error("data transaction failed: %s", type(exc).__name__)
            results = [(op, False, _storage_error(exc)) for op in live]
        self.fresh = None
        self.batches += 1
        self.ops += len(live)
        committed = [op for op, ok, _ in results if ok]
        for name in dict.fromkeys(op.name for op in committed):
            failpoint(f"{name}.after_commit")
        if self._on_commit is not None:
            self._on_commit()
        return results, True

    def _keystore_phase(self, live: list[WriteOp[Any]]) -> None:
        """The group's keystore transactions (each synced): ledger, create, move, destroy."""
        ledger = [item for op in live for item in op.ledger]
        if ledger:
            self._keystore.put_ledger(ledger)
        creates = [ref for op in live for ref in op.create_keys]
        self.fresh = self._keystore.create_record_keys(creates) if creates else None
        for op in live:
            if op.rewrap_keys and op.rewrap_to is not None:
                self._keystore.rewrap_record_keys(op.rewrap_keys, op.rewrap_to)
        destroy_keys = [ref for op in live for ref in op.destroy_keys]
        destroy_rings = [ring for op in live for ring in op.destroy_rings]
        destroy_owners = [owner for op in live for owner in op.destroy_owners]
        if destroy_keys or destroy_rings or destroy_owners:
            self._keystore.destroy(
                record_keys=destroy_keys, rings=destroy_rings, owners=destroy_owners
            )

    def _data_phase(self, ops: list[WriteOp[Any]]) -> list[tuple[WriteOp[Any], bool, Any]]:
        """Run ``ops`` in one data transaction, each in a nested one.

        Returns:
            (op, committed, value or exception) per op, once the transaction committed.

        Raises:
            lmdb.MapFullError: the transaction does not fit in the map.
            Exception: the transaction failed as a whole (disk error, …).
        """
        results: list[tuple[WriteOp[Any], bool, Any]] = []
        if self._on_begin is not None:
            self._on_begin()
        with self._env.begin(write=True) as parent:
            for op in ops:
                try:
                    with self._env.begin(write=True, parent=parent) as child:
                        if op.owner and self._guard is not None:
                            self._guard(child, op.owner)
                        value = op.apply(child)
                    results.append((op, True, value))
                except lmdb.MapFullError:
                    raise
                except Exception as exc:
                    results.append((op, False, exc))
            if self._before_commit is not None:
                self._before_commit(parent)
            failpoint(FP_BEFORE_COMMIT)
        return results

    def _unwrap_back(self, op: WriteOp[Any]) -> None:
        """Return the keys a failed op moved to their original rings."""
        assert op.rewrap_to is not None
        by_ring: dict[RingRef, list[str]] = {}
        for ring, key_id in op.rewrap_keys:
            by_ring.setdefault(ring, []).append(key_id)
        self._move_back([(op.rewrap_to, ring, key_ids) for ring, key_ids in by_ring.items()])

    def _move_back(
        self, moves: Sequence[tuple[RingRef, RingRef, list[str]]], *, retry: bool = False
    ) -> None:
        """Move ``(from ring, to ring, key ids)`` back, one ring per keystore transaction.

        A move that cannot be written is kept for :meth:`_retry_cleanup` (logged
        at error level the first time, at debug level on a retry).
        """
        for source, ring, key_ids in moves:
            try:
                self._keystore.rewrap_record_keys([(source, k) for k in key_ids], ring)
            except Exception as exc:  # kept; tried again by _retry_cleanup
                level = logging.DEBUG if retry else logging.ERROR
                _log.log(level, "moving keys back failed, will retry: %s", type(exc).__name__)
                self._unmoved.append((source, ring, key_ids))

    def _discard_keys(self, refs: Sequence[tuple[RingRef, str]], *, retry: bool = False) -> None:
        """Destroy record keys made for ops whose data never committed.

        No record refers to them, so they would only show up as
        ``keys_without_record``. Keys that cannot be destroyed now are kept for
        :meth:`_retry_cleanup` (logged at error level the first time, at debug
        level on a retry).
        """
        if not refs:
            return
        try:
            self._keystore.destroy(record_keys=refs, logged=False)
        except Exception as exc:  # kept; tried again by _retry_cleanup
            level = logging.DEBUG if retry else logging.ERROR
            _log.log(level, "discarding unused keys failed, will retry: %s", type(exc).__name__)
            self._undiscarded.extend(refs)


class _Tidy:
    """The queue item of :meth:`Writer.tidy`: no op, only the clean-up retry."""


_TIDY = _Tidy()


def _storage_error(exc: Exception) -> Exception:
    """The error a caller sees for a failed storage write.

    ``STORE_FULL`` when the map (``--max-store-size``) is full, ``UNAVAILABLE``
    for a disk error; an op's own error (a LetheError) is passed through.
    """
    if isinstance(exc, lmdb.MapFullError):
        return StoreFull("the store is full: it has reached --max-store-size")
    if isinstance(exc, lmdb.DiskError) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    ):
        return Unavailable("the disk is full; the write was not applied")
    if isinstance(exc, OSError | lmdb.Error):
        return Unavailable("a storage error stopped the write; it was not applied")
    return exc
