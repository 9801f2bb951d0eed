"""The audit: checks that must all be zero in a healthy store (API.md,
``Lifecycle.Audit``; ``lethe audit``).

- ``orphans``: live derivatives with a source that is missing, deleted or
  expired (zero by construction: a deletion cascades in its own transaction);
- ``stale_summaries``: live ``SUMMARY`` memories older than the last deletion
  in a thread one of their sources belongs to;
- ``keys_without_record``: record keys in the keystore that no record uses;
- ``records_without_key``: live records whose record key is gone;
- ``index_drift``: ids in a loaded index that are not live and visible, plus
  live visible records missing from a loaded index, plus contextual texts
  that quote a turn other than the nearest earlier visible one (indexes not
  loaded in this process are built from LMDB when needed, so they cannot
  drift).

Thread rules: read-only; any thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from server._memories import SLOT_KEY_ID, memory_ring, parse_record_name
from server._records import MemMeta, ThreadMeta, TurnMeta, thread_key
from server._search import Retriever
from server._store import Store, _get
from server._visibility import effective_state, general_visible, indexable
from shredder import RingRef


@dataclass(slots=True)
class AuditCounts:
    """Counts of an audit (see the module docstring); ``checked`` = records examined."""

    checked: int = 0
    orphans: int = 0
    stale_summaries: int = 0
    keys_without_record: int = 0
    records_without_key: int = 0
    index_drift: int = 0

    def healthy(self) -> bool:
        return not (
            self.orphans
            or self.stale_summaries
            or self.keys_without_record
            or self.records_without_key
            or self.index_drift
        )


def owners_of(store: Store) -> list[str]:
    """Every owner with a record in the store."""
    with store.env.begin() as txn:
        return [bytes(k).decode() for k, _ in txn.cursor(db=store.db["owners"])]


def audit(store: Store, retriever: Retriever | None, owner: str) -> AuditCounts:
    """Audit one owner's records, keys and loaded indexes."""
    counts = AuditCounts()
    now = time.time()
    turns = list(store.owner_turns(owner))
    memories = store.owner_memories(owner)
    counts.checked = len(turns) + len(memories)
    # The owner's slot-digest key indexes slots; it belongs to no single record.
    used: set[tuple[RingRef, str]] = {(RingRef(owner, None), SLOT_KEY_ID)}
    with store.env.begin() as txn:
        thread_rows = {}
        prefix = f"{owner}\x00".encode()
        cur = txn.cursor(db=store.db["threads"])
        if cur.set_range(prefix):
            for raw_key, raw in cur:
                if not bytes(raw_key).startswith(prefix):
                    break
                meta = ThreadMeta.decode(bytes(raw))
                thread_rows[meta.thread] = meta
                used.add((RingRef(owner, meta.thread), meta.title_key))
        for turn in turns:
            used.add((RingRef(owner, turn.ring_thread), turn.key_id))
            if turn.deleted:
                continue
            if not store.keystore.has_record_key(RingRef(owner, turn.ring_thread), turn.key_id):
                counts.records_without_key += 1
        for mem in memories:
            for key_id in mem.key_ids.values():
                used.add((memory_ring(mem), key_id))
            if mem.deleted or effective_state(mem, now) is None:
                continue
            if not store.keystore.has_record_key(memory_ring(mem), mem.key_id):
                counts.records_without_key += 1
            if any(_gone(store, txn, name, now) for name, _ in mem.sources):
                counts.orphans += 1
            if mem.kind == "SUMMARY":
                for name, _ in mem.sources:
                    parsed = parse_record_name(name)
                    if parsed is None or parsed[0] != "turn":
                        continue
                    raw_thread = _get(txn, thread_key(owner, parsed[2]), db=store.db["threads"])
                    if raw_thread is None:
                        continue
                    last = ThreadMeta.decode(raw_thread).last_deletion_time
                    if last and last > mem.update_time:
                        counts.stale_summaries += 1
                        break
    counts.keys_without_record = len(_unused(store, owner, used))
    if retriever is not None:
        counts.index_drift = _index_drift(retriever, owner, turns, memories, now)
    return counts


def _unused(store: Store, owner: str, used: set[tuple[RingRef, str]]) -> list[tuple[RingRef, str]]:
    return [ref for ref in store.keystore.list_record_keys(owner) if ref not in used]


def unreferenced_keys(store: Store, owner: str) -> list[tuple[RingRef, str]]:
    """Record keys of ``owner`` that no record uses (``keys_without_record``)."""
    used: set[tuple[RingRef, str]] = {(RingRef(owner, None), SLOT_KEY_ID)}
    with store.env.begin() as txn:
        prefix = f"{owner}\x00".encode()
        cur = txn.cursor(db=store.db["threads"])
        if cur.set_range(prefix):
            for raw_key, raw in cur:
                if not bytes(raw_key).startswith(prefix):
                    break
                meta = ThreadMeta.decode(bytes(raw))
                used.add((RingRef(owner, meta.thread), meta.title_key))
    for turn in store.owner_turns(owner):
        used.add((RingRef(owner, turn.ring_thread), turn.key_id))
    for mem in store.owner_memories(owner):
        for key_id in mem.key_ids.values():
            used.add((memory_ring(mem), key_id))
    return _unused(store, owner, used)


def _gone(store: Store, txn: object, name: str, now: float) -> bool:
    meta = store.resolve(txn, name)  # type: ignore[arg-type]
    return meta is None or effective_state(meta, now) is None


def _index_drift(
    retriever: Retriever,
    owner: str,
    turns: list[TurnMeta],
    memories: list[MemMeta],
    now: float,
) -> int:
    bundle = retriever.cache.get(f"o/{owner}")
    if bundle is None:
        return 0
    records: list[TurnMeta | MemMeta] = [*turns, *memories]
    visible = {m.rid for m in records if general_visible(m, now)}
    dense = {m.rid for m in records if indexable(m, now)}
    held_dense = {int(i) for i in bundle.dense.ids()}
    held_plain = {int(i) for i in bundle.plain.ids()}
    # Records without text tokens are held but never match; count only ids held
    # that should not be, and visible records missing from the plain leg.
    drift = len(held_dense ^ dense) + len(held_plain - visible) + len(visible - held_plain)
    # A contextual text quotes the turn before it: that must still be the
    # nearest earlier visible turn of the thread (a forgotten or sealed one
    # must have been re-indexed away).
    expected_prev: dict[int, int] = {}
    by_thread: dict[str, list[TurnMeta]] = {}
    for turn in turns:
        if general_visible(turn, now):
            by_thread.setdefault(turn.thread, []).append(turn)
    for ordered in by_thread.values():
        ordered.sort(key=lambda t: t.seq)
        for i, turn in enumerate(ordered):
            expected_prev[turn.rid] = ordered[i - 1].rid if i > 0 else 0
    for rid, prev in bundle.ctx_prev.items():
        if rid in expected_prev and prev not in (0, expected_prev[rid]):
            drift += 1
    return drift
