"""Warm starts: an owner's committed bundle kept between processes as an encrypted snapshot.

Without a snapshot an owner's indexes are built from LMDB on its first use after
a start, decrypting every vector and text (about 35 s at 100k turns on two
shared cores). With one, the first use reads the owner's snapshot file, opens it
(:meth:`server.store.Store.read_snapshot`), makes every leg again from its state
(:mod:`index._state`) and checks it against the store before any search sees it.

**What a snapshot holds.** The state of every leg of the owner's committed
bundle (dense, both BM25 legs, sessions, times), its maps (``ctx_prev``, the
memories' indexed ``versions``, ``watch``), the owner's embedder (whose vectors
the dense leg holds), and the digest of every stored row of the owner
(:meth:`server.store.Store.row_digests`: turns and memories, held or not) as it
was when the snapshot was saved. Never a pending bundle.

**Consistent when saved.** The legs are read each under its own lock while
searches go on; the owner's rows are then read, and the snapshot is written
only if the bundle agrees with them exactly (:func:`index_drift` is 0: every
visible record held and nothing else, memories at their current version,
vectors, contexts and sessions right) and put in place only if no change of the
bundle began since its legs were read
(:meth:`~server.retrieval._build.IndexBuilds.changes`, checked under the owner's
lock at the rename). So the rows' digests describe exactly what the legs hold.

**Exactly current, or not used.** On load, the digests of the owner's rows now
are compared with the snapshot's (one read pass, no row decoded). A row that is
unchanged is the row the legs were checked against; only rows written since
(changed, new or gone) are decoded, and they are *replayed* with the upkeep's
own steps: each leaves every leg (the turns that quoted it get new contexts)
and comes back if it is visible now, as a write would index it; the result is
checked with :func:`index_drift` against every row. Turns whose visibility
depends on time alone (a pending source of their lineage) are in ``watch``,
rechecked on first use like in any loaded bundle. A snapshot of another
embedder, a malformed one, more changed rows than :data:`REPLAY_MIN` or
:data:`REPLAY_SHARE` of the owner, or a replay that does not check out, is not
used: the owner is built from LMDB as before. Whatever the snapshot says, what
search can return is what LMDB says now.

**Forgetting.** Every deletion destroys the owner's snapshot key with its own
keys (step 3; :mod:`server.store._snapshots`) and removes the file, so no
snapshot written before a forget opens after it. A snapshot being written while
a forget runs is put in place only if no change began since its legs were
read, and step 2 of every forget counts one under the owner's lock, loaded
bundle or not: a snapshot that may hold a forgotten record is discarded, never
placed. A BM25 state never carries a removed document
(:meth:`index.LexicalIndex.to_state`).

**When.** :meth:`IndexSnapshots.save_snapshots` writes the snapshot of each
loaded owner whose bundle changed since its snapshot was written or loaded:
the sweeper once its writes settled (:data:`server.lifecycle.SNAPSHOT_SETTLE`,
under a CPU duty bound) and the server at a clean stop. A snapshot loaded
without a replay is not written again until the bundle changes.

Thread rules: any thread. Legs are read each under its own lock, never under
the owner's lock; loads run under the owner's lock, as builds do.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from index import (
    IdMap,
    IndexChangedError,
    LexicalIndex,
    SessionIndex,
    State,
    StatePieces,
    StateReader,
    TimeIndex,
    VectorIndex,
    combine_states,
    pack_state_stream,
    release_free_heap,
    separate_states,
)
from server.errors import LetheError
from server.retrieval._build import TRIM_AFTER_BUILD
from server.retrieval._bundle import Bundle, owner_key
from server.retrieval._drift import RowFacts, index_drift
from server.retrieval._upkeep import IndexUpkeep
from server.store import MemMeta, TurnMeta, general_visible, indexable

_log = logging.getLogger(__name__)

_Streamed = tuple[dict[str, Any], dict[str, npt.NDArray[Any] | StatePieces]]
"""A state whose arrays may be :class:`index.StatePieces` (for :func:`index.pack_state_stream`)."""
_Part = tuple[dict[str, Any], Mapping[str, npt.NDArray[Any] | StatePieces]]
_S = TypeVar("_S", State, _Streamed)

BUNDLE_STATE = "lethe-bundle"
"""The ``kind`` of a bundle's state."""
BUNDLE_VERSION = 1
"""Layout of a bundle's state written and the only one read (the legs carry their own).

Bump it with any change of what a leg holds for the same records: the analyzer
(:func:`index.analyze`), the indexed texts (:mod:`server.retrieval._indexed_text`),
the contexts, the session keys. (The BM25 parameters are checked on load.)"""
LEGS = ("dense", "plain", "ctx", "sessions", "times")
REPLAY_MIN = 1000
"""Changed rows a load may replay whatever the owner's size (see the module docstring)."""
REPLAY_SHARE = 0.2
"""Share of an owner's rows a load may replay beyond :data:`REPLAY_MIN`; past both
it builds from LMDB instead, which then costs about the same."""


def _pairs(mapping: Mapping[int, int] | Mapping[int, float], dtype: type) -> State:
    keys = np.fromiter(mapping.keys(), np.int64, count=len(mapping))
    values: npt.NDArray[Any] = np.fromiter(mapping.values(), dtype, count=len(mapping))
    return {}, {"keys": keys, "values": values}


def _unpairs(state: State) -> dict[int, Any]:
    arrays = state[1]
    try:
        return dict(zip(arrays["keys"].tolist(), arrays["values"].tolist(), strict=True))
    except (KeyError, ValueError) as exc:
        raise ValueError(f"malformed map in a bundle state: {exc!r}") from None


def _rid_map(state: State) -> IdMap:
    arrays = state[1]
    try:
        return IdMap(arrays["keys"].tolist(), arrays["values"].tolist())
    except (KeyError, ValueError) as exc:
        raise ValueError(f"malformed map in a bundle state: {exc!r}") from None


def bundle_state(bundle: Bundle, embedder: str, digests: Mapping[int, int]) -> State:
    """The state of an owner's committed bundle (every leg read under its own lock).

    Args:
        bundle: the bundle.
        embedder: the owner's embedder (whose vectors the dense leg holds).
        digests: the digest of every stored row of the owner the bundle agrees
            with (:func:`with_rows` adds them to a state taken before the rows
            were read).

    Returns:
        One :data:`index.State` holding every leg, the bundle's maps and the digests.
    """
    return cast(State, _bundle_state(bundle, embedder, digests, bundle.dense.to_state()))


def _bundle_state(
    bundle: Bundle, embedder: str, digests: Mapping[int, int], dense: _Part
) -> _Streamed:
    parts: dict[str, _Part] = {
        "dense": dense,
        "plain": bundle.plain.to_state(),
        "ctx": bundle.ctx.to_state(),
        "sessions": bundle.sessions.to_state(),
        "times": bundle.times.to_state(),
        "ctx_prev": ({}, dict(zip(("keys", "values"), bundle.ctx_prev.arrays(), strict=True))),
        "versions": _pairs(dict(bundle.versions), np.int64),
        "watch": _pairs(dict(bundle.watch), np.float64),
        "rows": _pairs(digests, np.int64),
    }
    meta, arrays = combine_states(parts)
    meta["bundle"] = {"kind": BUNDLE_STATE, "version": BUNDLE_VERSION, "embedder": embedder}
    return meta, arrays


def with_rows(state: _S, digests: Mapping[int, int]) -> _S:
    """``state`` (a :func:`bundle_state`) with ``digests`` as its row digests."""
    rows = combine_states({"rows": _pairs(digests, np.int64)})
    return {**state[0], **rows[0]}, {**state[1], **rows[1]}


def bundle_of(state: State) -> tuple[Bundle, str, dict[int, int]]:
    """The bundle :func:`bundle_state` described, its embedder and the row digests it agrees with.

    Consumes ``state``: its arrays are taken out of ``state[1]`` and each leg's
    are dropped once the leg is made, so a state read by
    :class:`index.StateReader` (each array its own memory) is freed leg by leg
    and the load's peak stays near the bundle's own size.

    Raises:
        ValueError: the state is not a bundle state of this version, or a leg's
            state is malformed.
    """
    head = state[0].get("bundle")
    if not isinstance(head, dict) or head.get("kind") != BUNDLE_STATE:
        raise ValueError("not a bundle state")
    if head.get("version") != BUNDLE_VERSION:
        raise ValueError(f"bundle state version {head.get('version')!r} is not {BUNDLE_VERSION}")
    parts = separate_states(state, [*LEGS, "ctx_prev", "versions", "watch", "rows"])
    state[1].clear()
    dense = VectorIndex.from_state(parts.pop("dense"))  # the largest leg first
    plain = LexicalIndex.from_state(parts.pop("plain"))
    ctx = LexicalIndex.from_state(parts.pop("ctx"))
    sessions = SessionIndex.from_state(parts.pop("sessions"))
    times = TimeIndex.from_state(parts.pop("times"))
    watch = _unpairs(parts["watch"])
    bundle = Bundle(
        dense,
        plain,
        ctx,
        ctx_prev=_rid_map(parts.pop("ctx_prev")),
        sessions=sessions,
        times=times,
        watch=watch,
        due=min(watch.values(), default=math.inf),
        versions=_unpairs(parts["versions"]),
    )
    for leg, fresh in (
        (bundle.plain, LexicalIndex()),
        (bundle.ctx, LexicalIndex()),
        (bundle.sessions, SessionIndex()),
    ):
        if leg.parameters != fresh.parameters:
            raise ValueError("the snapshot's BM25 parameters are not this version's")
    return bundle, str(head.get("embedder", "")), _unpairs(parts["rows"])


class IndexSnapshots(IndexUpkeep):
    """Snapshots of owners' committed bundles: saving, loading, replaying (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # owner -> changes() count its snapshot on disk reflects (written or loaded exactly)
        self._saved: dict[str, int] = {}
        self.loads = {"snapshot": 0, "replayed": 0, "built": 0}
        """How owners' bundles were made on first use since start (for tests and benchmarks)."""
        self._loads_guard = threading.Lock()

    # ------------------------------------------------------------------ saving

    def loaded_owners(self) -> list[str]:
        """Owners whose committed bundle is in memory, least recently used first."""
        prefix = owner_key("")
        keys = self.cache.keys()
        return [key[len(prefix) :] for key in keys if key.startswith(prefix)]

    def snapshot_due(self, owner: str, settle: float) -> bool:
        """Whether the bundle changed since its snapshot, but not in the last ``settle`` seconds."""
        count, at = self.changes(owner)
        return self._saved.get(owner) != count and time.monotonic() - at >= settle

    def save_snapshot(self, owner: str) -> int:
        """Write the snapshot of the owner's loaded bundle if it changed since the last one.

        See the module docstring ("Consistent when saved").

        Returns:
            Plaintext bytes written; 0 when nothing was written (no bundle
            loaded, unchanged, changed meanwhile, not in line with the rows
            yet, or the owner is gone).

        Raises:
            OSError: the file could not be written (nothing is in place).
        """
        with self._lock(owner):
            bundle = self.cache.peek(owner_key(owner))
            if bundle is None:
                return 0
            if bundle.due <= time.time():
                self._expire(owner, bundle)  # as its next use would
            count = self._changes.get(owner, 0)
            if self._saved.get(owner) == count:
                return 0
            embedder = self.store.owner_embedder(owner)
        # The vectors are copied a piece at a time as they are sealed, never whole.
        state = _bundle_state(bundle, embedder, {}, bundle.dense.state_in_pieces())
        facts = RowFacts(time.time())
        digests = self.store.snapshot_rows(owner, facts)
        if facts.index_drift(bundle):
            return 0  # an update is under way (or the bundle drifted: the audit says so)
        del facts
        size, buffers = pack_state_stream(*with_rows(state, digests))
        del state, digests
        published = False
        try:
            try:
                staged = self.store.stage_snapshot(owner, size, buffers)
            except (LetheError, IndexChangedError):  # the owner is gone or being forgotten;
                return 0  # or its vectors changed while sealed: the next pass tries again
            del buffers
            if len(bundle.plain) >= TRIM_AFTER_BUILD:
                release_free_heap()  # the state's copies and the sealed frames, back to the OS
            with self._lock(owner):
                self._catch_up_before_publish(owner)
                published = self._changes.get(owner, 0) == count and staged.publish()
                if published:
                    self._saved[owner] = count
                else:
                    staged.discard()
        finally:
            if not published:  # nothing in place (a failure included): nor its key, if new
                self._drop_unused_key(owner)  # outside the owner's lock: it waits for the writer
        return size if published else 0

    def _drop_unused_key(self, owner: str) -> None:
        """After a save that put nothing in place: its key goes if no snapshot uses it."""
        try:
            self.store.drop_unused_snapshot_key(owner)
        except (LetheError, OSError) as exc:  # start-up removes it as a stray
            _log.error("owners/%s: an unused snapshot key stays: %s", owner, type(exc).__name__)

    def _catch_up_before_publish(self, owner: str) -> None:
        """Apply what other processes changed of the owner before a save's rename.

        The owner's lock is held. One process: nothing to do (every change of
        the bundle counts under this lock). Several
        (:class:`~server.retrieval._follow.IndexFollow`): a forget made through
        another process reaches this one's count only when its change-log entry
        is applied, and it may have destroyed the snapshot key before this save
        made a new one; applying the owner's entries here counts it, so the save
        is discarded.
        """

    def save_snapshots(self, settle: float = 0.0, deadline: float | None = None) -> list[str]:
        """Save the snapshot of every loaded owner that is due (:meth:`snapshot_due`).

        Args:
            settle: seconds without a change an owner's bundle needs first.
            deadline: ``time.monotonic()`` past which no further owner is started.

        Returns:
            The owners whose snapshot was written. A failure is logged (owner
            and error type, never content) and does not stop the others; the
            next pass tries again.
        """
        saved = []
        for owner in reversed(self.loaded_owners()):  # most recently used first
            if deadline is not None and time.monotonic() >= deadline:
                break
            if not self.snapshot_due(owner, settle):
                continue
            try:
                if self.save_snapshot(owner):
                    saved.append(owner)
            except Exception as exc:
                why = type(exc).__name__
                _log.error("owners/%s: its index snapshot was not written: %s", owner, why)
        return saved

    def drop_snapshot(self, owner: str) -> None:
        """Forget that the owner's snapshot is current (its file is being removed)."""
        with self._lock(owner):
            self._saved.pop(owner, None)

    # ------------------------------------------------------------------ loading

    def _first_use(self, owner: str) -> Bundle:
        """The owner's bundle from its snapshot when it is current or replayed, else built.

        The caller holds the owner's lock.
        """
        self._touch(owner)
        start = time.perf_counter()
        try:
            bundle, replayed = self._load_snapshot(owner)
        except Exception as exc:  # a snapshot is only a cache: build, never fail the search
            why = type(exc).__name__
            _log.error("owners/%s: loading its index snapshot failed: %s", owner, why)
            self.store.discard_snapshot(owner)
            bundle, replayed = None, 0
        with self._loads_guard:
            self.loads["built" if bundle is None else "replayed" if replayed else "snapshot"] += 1
        if bundle is None:
            return self._timed_build(owner)
        if len(bundle.plain) >= TRIM_AFTER_BUILD:
            release_free_heap()  # the opened file and its state, back to the OS
        if not replayed:
            self._saved[owner] = self._changes.get(owner, 0)
        _log.info(
            "loaded the search index of owners/%s from its snapshot (%d rows replayed): "
            "%d texts in %.1f s",
            owner,
            replayed,
            len(bundle.plain),
            time.perf_counter() - start,
        )
        return bundle

    def _load_snapshot(self, owner: str) -> tuple[Bundle | None, int]:
        """``(bundle, rows replayed)`` from the owner's snapshot, or ``(None, 0)`` to build."""
        opened = self.store.read_snapshot_into(owner, StateReader)
        if opened is None:
            return None, 0
        reader = opened[1]
        del opened
        try:
            bundle, embedder, saved = bundle_of(reader.state())
        except ValueError as exc:
            _log.error("owners/%s: index snapshot is malformed (%s): rebuilding", owner, exc)
            self.store.discard_snapshot(owner)
            return None, 0
        finally:
            del reader
        if embedder != self.store.owner_embedder(owner):
            return None, 0  # another model's vectors: the owner was re-embedded since
        now_rows = self.store.row_digests(owner)
        changed = {r for r, d in now_rows.items() if saved.get(r) != d}
        changed.update(r for r in saved if r not in now_rows)
        if not changed:
            return bundle, 0
        if len(changed) > max(REPLAY_MIN, REPLAY_SHARE * len(now_rows)):
            return None, 0
        if not self._replay(owner, bundle, changed):
            return None, 0
        return bundle, len(changed)

    def _replay(self, owner: str, bundle: Bundle, changed: set[int]) -> bool:
        """Bring a loaded bundle in line with rows written since its snapshot; False to build.

        Each changed record is reapplied (:meth:`_reapply`); then the whole
        bundle is checked against every row.
        """
        now = time.time()
        turns = {m.rid: m for m in self.store.owner_turns(owner)}
        mems = {m.rid: m for m in self.store.owner_memories(owner)}
        if not self._reapply(owner, bundle, changed, turns, mems, now):
            return False
        drift = index_drift(bundle, turns.values(), mems.values(), now)
        if drift:
            _log.error("owners/%s: a replayed snapshot drifts by %d: rebuilding", owner, drift)
        return not drift

    def _reapply(
        self,
        owner: str,
        bundle: Bundle,
        changed: set[int],
        turns: Mapping[int, TurnMeta],
        mems: Mapping[int, MemMeta],
        now: float,
    ) -> bool:
        """Bring ``bundle`` in line with the rows of ``changed``; False if it cannot be.

        Each changed record leaves every leg and comes back if it is visible
        now, as the upkeep would do it; the turns that quoted one that left get
        new contexts. Reapplying a row that did not change changes nothing.

        Args:
            owner: the bundle's owner.
            bundle: the owner's committed bundle (the caller holds its lock).
            changed: record numbers whose rows changed (or are gone).
            turns: rows as reads see them now, of at least every changed turn
                and every turn the bundle holds that quotes one (rid -> meta).
            mems: rows of at least every changed memory (rid -> meta).
            now: the time the rows were read (seconds since the epoch).

        Returns:
            False when the changed vectors are of another dimension than the
            dense leg's (the owner must be built again).
        """
        quoting = [turns[r] for r in bundle.ctx_prev.quoting(changed) if r in turns]
        bundle.forget_ids(sorted(changed))
        by_thread: dict[str, list[TurnMeta]] = {}
        for meta in quoting:
            if general_visible(meta, now):
                by_thread.setdefault(meta.thread, []).append(meta)
        for thread, targets in by_thread.items():
            self._set_contexts(owner, bundle, thread, targets)
        came = sorted(
            (turns[r] for r in changed if r in turns and general_visible(turns[r], now)),
            key=lambda m: (m.thread, m.seq),
        )
        if came:
            rids, vecs = self._vectors([m for m in came if indexable(m, now)], None)
            if rids and len(bundle.dense) and bundle.dense.dim != vecs.shape[1]:
                return False
            self._add_turns(owner, bundle, came, rids, vecs, {})
        self._fill_memories(
            bundle, [mems[r] for r in changed if r in mems and general_visible(mems[r], now)]
        )
        return True
