"""Following the change log: indexes kept current across processes sharing a data directory.

With ``lethe serve --processes N`` each process holds the indexes of the owners
it served, and a write or a forget may be made through any process. A store
opened for several processes keeps a change log (:mod:`server.store._changes`:
per owner, numbered entries naming the rows that changed, written in the same
transaction as the rows). Here every process follows it:

- **Before a search or a context assembly** of an owner (:meth:`owner_bundle`,
  :meth:`pending_bundle`), under the owner's lock, the owner's entries after
  the one its bundle reflects are read and their rows *reapplied* with the
  upkeep's own steps (:meth:`~server.retrieval._snapshot.IndexSnapshots._reapply`:
  each changed record leaves every leg and comes back if visible; the turns
  that quoted it get new contexts). An entry ``*`` (a whole thread or the owner
  forgotten, the owner moved), or one no longer kept, drops the bundle: it is
  loaded again (snapshot or build). The owner's pending bundles are dropped
  whenever it has a new entry. So a write committed, through any process,
  before a search begins is in the indexes that search reads; what the search
  returns is rechecked against LMDB as always.
- **A follower thread** (:meth:`follow`) reads the feed of owners that changed
  every :data:`FOLLOW_INTERVAL` seconds and brings each loaded one in line the
  same way, and drops the cached unwrapped keys of each changed owner
  (:meth:`shredder.Keystore.evict_owner`): a record forgotten through another
  process leaves this process's indexes (vector and text) and key cache within
  about :data:`FOLLOW_INTERVAL` plus one pass, searched or not. It also reads
  the KEK file again: after a rotation by the primary, the destroyed KEK
  versions and every cached ring key leave this process's memory too.
- **This process's own writes and forgets** take the same path
  (:meth:`on_write` and :meth:`on_forget` catch the owner up), so a bundle
  is changed in one way only and every change is applied once per entry.

Every entry read is applied to a bundle loaded before it committed; applying an
entry again (a bundle loaded after its rows were written) changes nothing, so
the number a bundle reflects is read *before* it is loaded.

A store of one process keeps no change log and none of this runs: upkeep is
:class:`~server.retrieval._upkeep.IndexUpkeep`'s alone.

Thread rules: any thread; changes of one owner's bundles hold the owner's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from server.retrieval._bundle import Bundle, owner_key, pending_prefix
from server.retrieval._snapshot import IndexSnapshots
from server.store import RecordMeta

_log = logging.getLogger(__name__)

FOLLOW_INTERVAL = 0.5
"""Seconds between two passes of the follower thread over the owners that changed."""


class IndexFollow(IndexSnapshots):
    """Indexes that follow the store's change log when it keeps one (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.follows = bool(getattr(self.store, "change_log", False))
        """Whether this store keeps a change log (several processes share it)."""
        # owner -> change-log entry its committed bundle reflects
        self._applied: dict[str, int] = {}
        # owner -> change-log entry its pending bundles reflect
        self._pending_seen: dict[str, int] = {}
        self._follow_stop = threading.Event()
        self._follower: threading.Thread | None = None
        self._feed_seen = 0

    # ------------------------------------------------------------------ catching up

    def _catch_up(self, owner: str) -> bool:
        """Apply the owner's change-log entries to its loaded bundles; the caller holds its lock.

        Returns:
            Whether anything changed (a bundle reapplied or dropped).
        """
        moved = False
        seq = self.store.change_seq(owner)
        if self._pending_seen.get(owner) != seq:  # unknown: what is loaded may be older
            moved = self.cache.evict_prefix(pending_prefix(owner)) > 0  # rebuilt on next use
        self._pending_seen[owner] = seq
        key = owner_key(owner)
        bundle = self.cache.peek(key)
        if bundle is None:
            self._applied.pop(owner, None)
            return moved
        last, rids = self.store.changes_since(owner, self._applied.get(owner, 0))
        if rids is None:
            self._touch(owner)
            self.cache.evict(key)
            self._applied.pop(owner, None)
            return True
        if rids:
            self._touch(owner)
            now = time.time()
            quoting = bundle.ctx_prev.quoting(rids)
            turns, mems = self.store.changed_records(sorted(rids | set(quoting)))
            if not self._reapply(
                owner, bundle, rids, {m.rid: m for m in turns}, {m.rid: m for m in mems}, now
            ):
                self.cache.evict(key)  # another dimension: built again on next use
                self._applied.pop(owner, None)
                return True
            self.cache.trim()
            moved = True
        self._applied[owner] = last
        return moved

    def _catch_up_before_publish(self, owner: str) -> None:
        """Apply the owner's change-log entries before a snapshot save's rename (lock held).

        A forget made through another process writes its entry in its first
        transaction, before it destroys the owner's snapshot key; a save that
        made a new key after that sees the entry here, counts it, and is
        discarded instead of putting a forgotten record in place.
        """
        if self.follows:
            self._catch_up(owner)

    def owner_bundle(self, owner: str) -> Bundle:
        """The owner's committed bundle, brought in line with the change log first."""
        if self.follows:
            with self._lock(owner):
                self._catch_up(owner)
        return super().owner_bundle(owner)

    def pending_bundle(self, owner: str, thread: str) -> Bundle:
        """A thread's pending bundle, dropped first if the owner has a new change-log entry."""
        if self.follows:
            with self._lock(owner):
                self._catch_up(owner)
        return super().pending_bundle(owner, thread)

    def _first_use(self, owner: str) -> Bundle:
        """As the base's, noting first the change-log entry the new bundle reflects."""
        if self.follows:
            self._applied[owner] = self.store.change_seq(owner)
        return super()._first_use(owner)

    def on_write(
        self,
        owner: str,
        records: Sequence[RecordMeta],
        written: Mapping[int, tuple[str, npt.NDArray[np.float32] | None]] | None = None,
        removals: int | None = None,
    ) -> None:
        """As :meth:`IndexUpkeep.on_write`, or, following the log, the owner caught up."""
        if not self.follows:
            super().on_write(owner, records, written, removals)
            return
        with self._lock(owner):
            self._catch_up(owner)

    def on_forget(
        self,
        owner: str,
        rids: Sequence[int],
        threads: Sequence[str],
        whole_owner: bool,
        touched_threads: Sequence[str] = (),
        positions: Mapping[int, tuple[str, int]] | None = None,
    ) -> None:
        """As :meth:`IndexUpkeep.on_forget`, or, following the log, the owner caught up.

        Either way a change is counted under the owner's lock, loaded bundle or
        not, so no snapshot read before it is put in place.
        """
        if not self.follows:
            super().on_forget(owner, rids, threads, whole_owner, touched_threads, positions)
            return
        with self._lock(owner):
            self._touch(owner)
            self._removals[owner] = self._removals.get(owner, 0) + 1
            self._catch_up(owner)
        self.store.keystore.evict_owner(owner)

    # ------------------------------------------------------------------ the follower

    def follow_once(self) -> list[str]:
        """One pass of the follower: every owner with new entries caught up.

        Returns:
            The owners that had new entries (their cached keys dropped too).
        """
        last, owners = self.store.owners_changed_since(self._feed_seen)
        self._feed_seen = last
        keys = self.cache.keys()
        held = {k.split("/", 2)[1] for k in keys}  # "o/{owner}", "p/{owner}/{thread}"
        if self.store.kek.reload() or owners is None:  # a rotation, or fell behind the feed
            self.store.keystore.evict_cached()
        if owners is None:  # every owner held may have changed
            owners = set(held)
        for owner in sorted(owners):
            if owner in held:
                with self._lock(owner):
                    self._catch_up(owner)
            self.store.keystore.evict_owner(owner)
        for owner in set(self._applied) | set(self._pending_seen):
            if owner not in held:  # nothing of it loaded: its next use starts afresh
                with self._lock(owner):
                    self._forget_seen(owner)
        return sorted(owners)

    def _forget_seen(self, owner: str) -> None:
        """Drop what is noted of an owner nothing of which is loaded; the caller holds its lock."""
        if self.cache.peek(owner_key(owner)) is None:
            self._applied.pop(owner, None)
        keys = self.cache.keys()
        if not any(k.startswith(pending_prefix(owner)) for k in keys):
            self._pending_seen.pop(owner, None)

    def follow(
        self,
        interval: float = FOLLOW_INTERVAL,
        on_change: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        """Start the follower thread (none without a change log); :meth:`stop_following` ends it.

        Args:
            interval: seconds between passes (:meth:`follow_once`).
            on_change: called with the owners that had new entries after each
                pass that found some (the server wakes its ``Watch`` streams
                with it: events written through other processes); must not raise.
        """
        if not self.follows or self._follower is not None:
            return
        self._feed_seen = self.store.owners_changed_since(0)[0]
        self._follow_stop.clear()

        def run() -> None:
            while not self._follow_stop.wait(interval):
                try:
                    owners = self.follow_once()
                    if owners and on_change is not None:
                        on_change(frozenset(owners))
                except Exception as exc:  # keep following; the next pass tries again
                    _log.error("following the change log failed: %s", type(exc).__name__)

        self._follower = threading.Thread(target=run, name="lethe-follow", daemon=True)
        self._follower.start()

    def stop_following(self) -> None:
        """Stop the follower thread and wait for it (idempotent)."""
        self._follow_stop.set()
        if self._follower is not None:
            self._follower.join()
            self._follower = None
