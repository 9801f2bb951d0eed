"""Threads and turns: creating, appending, reading through the visibility rules, bulk reads.

Creating threads, appending turns (with a response's lineage), reading them
through the visibility rules, and the bulk reads the index builds and context
assembly need (API.md, ``Threads``).

Thread rules: writes run on the writer thread through ``WriteOp``; reads open
their own read transactions and are safe from any thread.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, cast

import lmdb
import numpy as np
import numpy.typing as npt

from lethe.names import new_id, parse_manifest
from server.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    Reason,
)
from server.store import _json
from server.store import _schema as sk
from server.store._base import lineage_expiry_of, thread_name
from server.store._echoes import ECHO_FORGET, ECHO_TAINT, Shingler
from server.store._lineage import add_edges
from server.store._memories import MemoriesPart
from server.store._records import (
    COMMITTED,
    CONVERSATION,
    PAYLOAD_CONTENT,
    PAYLOAD_EMBEDDING,
    PAYLOAD_MEMORY,
    PAYLOAD_TITLE,
    PENDING,
    REPAIR,
    REPAIR_CONTINUED,
    SEALED,
    ManifestRow,
    RecordMeta,
    ThreadMeta,
    TurnMeta,
    pack_content,
    stack_vectors,
)
from server.store._shapes import SLOTTED_KINDS, SlotConflict
from server.store._views import MemoryDraft, MemoryView, ThreadView, TurnDraft, TurnView
from server.store._visibility import check_readable, listable, source_alive, thread_gone
from server.store._writer import WriteOp
from shredder import AssociatedData, RingRef

_log = logging.getLogger(__name__)


def _noop(txn: lmdb.Transaction) -> None:
    del txn


class ThreadsPart(MemoriesPart):
    """Thread and turn operations of :class:`~server.store.Store`, over the memories part.

    An append writes its tagger candidates in its own transaction.
    """

    # ------------------------------------------------------------------ threads

    def create_thread(self, owner: str, thread: str, title: str) -> ThreadView:
        """Create a thread (and its ring key).

        Raises:
            AlreadyExists: a live thread has that id.
        """
        now = time.time()
        ring = RingRef(owner, thread)
        title_key = "title-" + secrets.token_hex(8)
        name = thread_name(owner, thread)

        def apply(txn: lmdb.Transaction) -> ThreadView:
            if self._thread_row(txn, owner, thread) is not None:
                raise AlreadyExists(f"{name} already exists")
            stone = self._tombstone_of(txn, name)
            last_seq = stone.last_seq if stone is not None else 0
            txn.delete(sk.tombstone_key(name), db=self.t.tombstones)
            self._ensure_owner(txn, owner, now)
            txn.delete(sk.tombstone_key(f"owners/{owner}"), db=self.t.tombstones)
            # A forgotten thread's id may be used again; its turns number on
            # after the old ones, so an old turn name stays RECORD_DELETED.
            meta = ThreadMeta(owner, thread, CONVERSATION, now, now, last_seq, title_key)
            self._put_thread(txn, meta)
            ad = AssociatedData(owner, name, 1, PAYLOAD_TITLE)
            txn.put(
                sk.thread_key(owner, thread),
                self._seal(ring, title_key, ad, title.encode()),
                db=self.t.titles,
            )
            return ThreadView(meta, title)

        return self.writer.run(
            WriteOp(apply, owner=owner, create_keys=[(ring, title_key)], name="thread.create")
        )

    def get_thread(self, owner: str, thread: str) -> ThreadView:
        """Read a thread.

        Raises:
            RecordDeleted: it was forgotten.
            NotFound: it never existed.
        """
        with self.env.begin() as txn:
            meta = self._live_thread(txn, owner, thread)
            ct = self._title_ct(txn, meta)
        return self._thread_view(meta, ct)

    def _title_ct(self, txn: lmdb.Transaction, meta: ThreadMeta) -> bytes | None:
        if not meta.title_key:
            return None
        return sk.get(txn, self.t.titles, sk.thread_key(meta.owner, meta.thread))

    def list_threads(
        self, owner: str, after: str, limit: int, include_repairs: bool = False
    ) -> tuple[list[ThreadView], str]:
        """Threads of ``owner`` ordered by id, starting after id ``after``.

        Returns:
            (threads, next id to resume after or "" at the end).
        """
        prefix = sk.owner_prefix(owner)
        start = prefix + after.encode() + b"\x01" if after else None
        now = time.time()
        rows: list[tuple[ThreadMeta, bytes | None]] = []
        more = False
        with self.env.begin() as txn:
            for _, raw in sk.scan(txn, self.t.threads, prefix, start=start):
                meta = ThreadMeta.decode(raw)
                if thread_gone(meta, now) or (meta.kind == REPAIR and not include_repairs):
                    continue
                if len(rows) == limit:
                    more = True
                    break
                rows.append((meta, self._title_ct(txn, meta)))
        views = [self._thread_view(meta, ct) for meta, ct in rows]
        return views, (views[-1].meta.thread if more and views else "")

    # ------------------------------------------------------------------ appends

    def find_request(self, owner: str, thread: str, request_id: str) -> list[int] | None:
        """Rids recorded for an idempotent AppendTurns, or None."""
        with self.env.begin() as txn:
            raw = sk.get(txn, self.t.requests, sk.request_key(owner, thread, request_id))
        return None if raw is None else [int(r) for r in _json.loads(raw)]

    def append_turns(
        self,
        owner: str,
        thread: str,
        drafts: Sequence[TurnDraft],
        request_id: str,
        *,
        candidates: Sequence[Sequence[MemoryDraft]] = (),
        pending_ttl: float = 0.0,
        shingler: Shingler | None = None,
    ) -> tuple[list[TurnMeta], bool, list[MemoryView]]:
        """Append turns at the end of a thread, with their tagger candidates, in one transaction.

        After a crash either all of it is stored or none.

        Drafts must already carry their embeddings (or None when the owner has
        no embedder and the client sent none).

        Args:
            owner: the thread's owner.
            thread: the thread's id.
            drafts: the validated turns, in the order they are appended.
            request_id: the client's idempotency key, or "" for none: a retry
                with the same key appends nothing and returns the turns the
                first attempt stored.
            candidates: per draft, the memories proposed for it (client tags or
                the write-time rules); each is stored ``PENDING`` with the turn
                as its source and announced with ``CANDIDATE_PROPOSED``. None is
                made for a turn that is sealed or born tainted; one whose slot is
                held is skipped with a ``SLOT_CONFLICT`` event.
            pending_ttl: lifetime of the candidates, seconds.
            shingler: a text's word shingles, for the owner's echo guards
                (:mod:`server.store._echoes`): a turn whose text echoes a text
                forgotten within a guard's window is stored born tainted
                (``TAINT``) or refuses the whole append (``FORGET``). None: no
                check.

        Returns:
            (the stored turns' metadata, True if this was a retry of
            ``request_id`` that appended nothing, the candidates stored).

        Raises:
            NotFound / RecordDeleted: the thread does not exist / was forgotten.
            FailedPrecondition: a repair thread that is not ``CONTINUED``
                (reason ``REPAIR_NOT_CONTINUED``).
            InvalidArgument: an embedding's dimension differs from the owner's
                (reason ``DIMENSION_MISMATCH``), or a named manifest is missing.
            FailedPrecondition: ``ECHOES_FORGOTTEN``: a turn's text echoes a
                text forgotten with ``FORGET`` within its guard's window.
        """
        now = time.time()
        ring = RingRef(owner, thread)
        key_ids = [secrets.token_hex(8) for _ in drafts]
        proposals = [list(c) for c in candidates] or [[] for _ in drafts]
        cand_keys = [[secrets.token_hex(8) for _ in c] for c in proposals]
        if any(d.kind in SLOTTED_KINDS and d.content.slot for c in proposals for d in c):
            self.ensure_slot_key(owner)
        req_key = sk.request_key(owner, thread, request_id) if request_id else b""
        all_keys = [(ring, kid) for kid in key_ids] + [
            (ring, kid) for keys in cand_keys for kid in keys
        ]
        op: WriteOp[tuple[list[TurnMeta], bool, list[MemoryView]]]

        def apply(txn: lmdb.Transaction) -> tuple[list[TurnMeta], bool, list[MemoryView]]:
            if req_key:
                prior = sk.get(txn, self.t.requests, req_key)
                if prior is not None:  # the keys made for this attempt hold nothing
                    op.unused.extend(all_keys)
                    return self._turns(txn, [int(r) for r in _json.loads(prior)]), True, []
            tmeta = self._live_thread(txn, owner, thread)
            repair = tmeta.kind == REPAIR
            if repair and tmeta.repair_state != REPAIR_CONTINUED:
                name = thread_name(owner, thread)
                raise FailedPrecondition(
                    f"{name} is {tmeta.repair_state}: reopen it to append",
                    reason=Reason.REPAIR_NOT_CONTINUED,
                    subject=name,
                )
            self._check_dims(txn, owner, drafts, now)
            verdicts = self._echo_check(txn, owner, [d.text for d in drafts], shingler)
            for i, verdict in enumerate(verdicts):
                if verdict == ECHO_FORGET:
                    raise self._refuse_echo(f"turns[{i}].text")
            next_rid = self._next_rids(txn, len(drafts))
            # A sealed turn never expires; the others carry the owner's default
            # retention and the thread's, whichever ends first.
            retain = 0.0 if repair else self._born_retention(txn, owner, now, tmeta.expire_time)
            metas: list[TurnMeta] = []
            for i, draft in enumerate(drafts):
                state = SEALED if repair else COMMITTED if draft.commit else PENDING
                pending_end = now + draft.pending_ttl if state == PENDING else 0.0
                ends = [t for t in (pending_end, retain if state != SEALED else 0.0) if t]
                meta = TurnMeta(
                    rid=next_rid + i,
                    owner=owner,
                    thread=thread,
                    seq=tmeta.last_seq + 1 + i,
                    role=draft.role,
                    state=state,
                    version=1,
                    time=draft.time if draft.time is not None else now,
                    create_time=now,
                    expire_time=min(ends) if ends else 0.0,
                    key_id=key_ids[i],
                    has_embedding=draft.embedding is not None,
                    context_manifest=draft.context_manifest,
                    context_refs=list(draft.context_refs),
                    retain_until=retain,
                )
                if meta.context_refs or meta.context_manifest:
                    lineage = self._response_lineage(txn, meta, now)
                    if meta.context_refs:
                        meta.context_refs = lineage[: len(meta.context_refs)]
                if verdicts[i] == ECHO_TAINT:
                    self._taint_echo(meta)
                self._write_turn(txn, meta, draft)
                metas.append(meta)
            tmeta.last_seq += len(drafts)
            tmeta.update_time = now
            self._put_thread(txn, tmeta)
            if req_key:
                txn.put(req_key, _json.dumps([m.rid for m in metas]), db=self.t.requests)
            stored = self._store_candidates(txn, metas, proposals, cand_keys, pending_ttl, now, op)
            return metas, False, stored

        op = WriteOp(apply, owner=owner, create_keys=all_keys, name="append")
        return self.writer.run(op)

    def _store_candidates(
        self,
        txn: lmdb.Transaction,
        metas: Sequence[TurnMeta],
        proposals: Sequence[Sequence[MemoryDraft]],
        keys: Sequence[Sequence[str]],
        pending_ttl: float,
        now: float,
        op: WriteOp[Any],
    ) -> list[MemoryView]:
        """Store each turn's candidates (see :meth:`append_turns`).

        The keys of those not stored go on ``op.unused``.
        """
        stored: list[MemoryView] = []
        for meta, drafts, key_ids in zip(metas, proposals, keys, strict=True):
            ring = RingRef(meta.owner, meta.thread)
            for draft, key_id in zip(drafts, key_ids, strict=True):
                if meta.state == SEALED or meta.tainted:
                    op.unused.append((ring, key_id))
                    continue
                draft.sources = [(meta.name, meta.version)]
                try:
                    with self.env.begin(write=True, parent=txn) as child:
                        view = self._insert_memory(
                            child,
                            meta.owner,
                            new_id(),
                            draft,
                            key_id,
                            meta.thread,
                            commit=False,
                            pending_ttl=pending_ttl,
                            now=now,
                        )
                except SlotConflict as conflict:  # the turn is stored; the candidate is not
                    op.unused.append((ring, key_id))
                    self._append_event(txn, meta.owner, "SLOT_CONFLICT", conflict.holder, now)
                    continue
                self._append_event(txn, meta.owner, "CANDIDATE_PROPOSED", view.meta.name, now)
                stored.append(view)
        return stored

    def _response_lineage(
        self, txn: lmdb.Transaction, meta: TurnMeta, now: float
    ) -> list[tuple[str, int]]:
        """Write a response's lineage, and taint it at once if any of it is already gone.

        The lineage is its ``context_refs`` plus its ``context_manifest``'s
        refs; a response built on a ref already gone was produced from deleted
        material.

        Returns:
            The refs with version 0 replaced by the record's current version.
        """
        refs: list[tuple[str, int]] = []
        wanted = list(meta.context_refs)
        if meta.context_manifest:
            manifest = parse_manifest(meta.context_manifest)
            raw = sk.get(txn, self.t.manifests, sk.manifest_key(meta.owner, manifest.manifest))
            if raw is None:
                raise InvalidArgument("context_manifest", f"{meta.context_manifest} not found")
            wanted += ManifestRow.decode(raw).refs
        found = []
        for name, version in dict.fromkeys(wanted):
            source = self.resolve(txn, name)
            # A later version (a correction) does not taint; a deletion does.
            if source is None or not source_alive(source, now):
                meta.tainted = True
            else:
                found.append(source)
            refs.append((name, version or (source.version if source is not None else 0)))
        meta.lineage_expiry = lineage_expiry_of(found)
        add_edges(txn, self.t, meta.name, meta.version, refs)
        return refs

    def _check_dims(
        self, txn: lmdb.Transaction, owner: str, drafts: Sequence[TurnDraft], now: float
    ) -> None:
        dims = {d.embedding.shape[0] for d in drafts if d.embedding is not None}
        if not dims:
            return
        row = self._ensure_owner(txn, owner, now)
        expected = row.dim or min(dims)
        for i, draft in enumerate(drafts):
            if draft.embedding is not None and draft.embedding.shape[0] != expected:
                raise InvalidArgument(
                    f"turns[{i}].embedding",
                    f"dimension {draft.embedding.shape[0]} differs from the owner's {expected}",
                    reason=Reason.DIMENSION_MISMATCH,
                )
        if not row.dim:
            row.dim = expected
            self._put_owner(txn, owner, row)

    def _write_turn(self, txn: lmdb.Transaction, meta: TurnMeta, draft: TurnDraft) -> None:
        ring = RingRef(meta.owner, meta.thread)
        payloads = [(PAYLOAD_CONTENT, pack_content(draft.speaker, draft.text))]
        if draft.embedding is not None:
            payloads.append((PAYLOAD_EMBEDDING, draft.embedding.astype("<f4").tobytes()))
        for ptype, plain in payloads:
            ad = AssociatedData(meta.owner, meta.name, meta.version, ptype)
            ct = self._seal(ring, meta.key_id, ad, plain)
            txn.put(sk.payload_key(meta.rid, ptype), ct, db=self.t.payloads)
        self._put_turn(txn, meta)
        txn.put(sk.seq_key(meta.owner, meta.thread, meta.seq), sk.rid_key(meta.rid), db=self.t.seqs)
        txn.put(sk.owner_record_key(meta.owner, meta.rid), b"", db=self.t.owner_records)
        self._queue_expiry(txn, meta)

    # ------------------------------------------------------------------ reads

    def owner_dim(self, owner: str) -> int | None:
        """The owner's fixed vector dimension, or None before its first vector."""
        with self.env.begin() as txn:
            row = self._owner_row(txn, owner)
        return row.dim if row is not None and row.dim else None

    def metas(self, rids: Sequence[int]) -> list[TurnMeta]:
        """Current metadata of the turns ``rids``, as reads see them, in one read transaction.

        Missing ones are skipped.
        """
        now = time.time()
        with self.env.begin() as txn:
            return self._turns_read(txn, self._turns(txn, rids), now)

    def contents(self, metas: Sequence[TurnMeta]) -> list[tuple[TurnMeta, dict[str, bytes]]]:
        """``(meta, {"content": ciphertext})`` of turns just read, in ONE read transaction.

        The transaction reads only their content payloads (an index build has
        every row already; :meth:`fetch` would decode each again). A turn's key
        id and version never change, so its meta opens its payload; turns whose
        payload is gone (purged by a forget) are left out.
        """
        out: list[tuple[TurnMeta, dict[str, bytes]]] = []
        with self.env.begin() as txn:
            for meta in metas:
                ct = sk.get(txn, self.t.payloads, sk.payload_key(meta.rid, PAYLOAD_CONTENT))
                if ct is not None:
                    out.append((meta, {PAYLOAD_CONTENT: ct}))
        return out

    def fetch(self, rids: Sequence[int]) -> dict[int, tuple[RecordMeta, dict[str, bytes]]]:
        """Metadata and content ciphertexts of ``rids`` in ONE read transaction.

        For the recheck of search hits; rids without a row are absent.

        A turn's entry maps ``content`` to its ciphertext; a memory's maps
        ``memory`` to its current version's content ciphertext.
        """
        out: dict[int, tuple[RecordMeta, dict[str, bytes]]] = {}
        now = time.time()
        with self.env.begin() as txn:
            for rid in rids:
                turn = self._turn_read(txn, rid, now)
                if turn is not None:
                    out[rid] = (turn, self._read_payloads(txn, rid, False))
                    continue
                raw = self._memory(txn, rid)
                if raw is None:
                    continue
                mem = self._memory_read(txn, raw, now)
                ct = self._memory_ct(txn, mem, mem.version)
                out[rid] = (mem, {PAYLOAD_MEMORY: ct} if ct is not None else {})
        return out

    def get_turn(self, owner: str, thread: str, seq: int, with_embedding: bool) -> TurnView:
        """Read one turn through the visibility rules.

        Raises:
            NotFound: never existed. RecordDeleted: deleted or expired.
            FailedPrecondition: sealed. DataLoss: ciphertext fails authentication.
        """
        name = f"{thread_name(owner, thread)}/turns/{seq}"
        now = time.time()
        with self.env.begin() as txn:
            found = self._turn_at(txn, owner, thread, seq)
            if found is None:
                self._raise_missing(txn, name)
            meta = cast(TurnMeta, self._as_read(txn, found, now))
            check_readable(meta, now)
            cts = self._read_payloads(txn, meta.rid, with_embedding)
        return self.turn_view(meta, cts, with_embedding)

    def check_live(self, name: str) -> None:
        """Refuse a turn or memory name that is not readable now.

        Raises:
            NotFound: never existed. RecordDeleted: deleted or expired.
            FailedPrecondition: sealed (reason ``SEALED``).
        """
        now = time.time()
        with self.env.begin() as txn:
            found = self.resolve(txn, name)
            if found is None:
                self._raise_missing(txn, name)
            meta = self._as_read(txn, found, now)
        check_readable(meta, now)

    def list_turns(
        self,
        owner: str,
        thread: str,
        after_seq: int,
        limit: int,
        *,
        states: set[str],
        include_tainted: bool,
        with_embedding: bool,
    ) -> tuple[list[TurnView], int]:
        """Turns of a thread in seq order after ``after_seq``.

        Returns:
            (turns, the seq to resume after, or 0 at the end).

        Raises:
            NotFound / RecordDeleted: the thread.
        """
        now = time.time()
        rows: list[tuple[TurnMeta, dict[str, bytes]]] = []
        more = False
        with self.env.begin() as txn:
            self._live_thread(txn, owner, thread)
            start = sk.seq_key(owner, thread, after_seq + 1)
            for _, rk in sk.scan(txn, self.t.seqs, sk.thread_prefix(owner, thread), start=start):
                meta = self._turn_read(txn, sk.rid_of(rk), now)
                if meta is None or not listable(meta, now, states, include_tainted):
                    continue
                if len(rows) == limit:
                    more = True
                    break
                rows.append((meta, self._read_payloads(txn, meta.rid, with_embedding)))
        views = self.open_each(rows, lambda m, cts: self.turn_view(m, cts, with_embedding))
        return views, (rows[-1][0].seq if more and rows else 0)

    def replay_turns(self, rids: Sequence[int]) -> list[TurnView]:
        """The turns of a retried append, through the visibility rules.

        A turn since deleted, expired, sealed or tainted is left out.
        """
        rows = self.fetch(rids)
        now = time.time()
        kept: list[tuple[TurnMeta, dict[str, bytes]]] = []
        for rid in rids:
            row = rows.get(rid)
            if row is None:
                continue
            meta, cts = row
            if isinstance(meta, TurnMeta) and listable(
                meta, now, {PENDING, COMMITTED}, include_tainted=False
            ):
                kept.append((meta, cts))
        return self.open_each(kept, lambda m, cts: self.turn_view(m, cts, with_embedding=False))

    def recent_turns(self, owner: str, thread: str, count: int) -> list[TurnView]:
        """The last ``count`` turns of a thread that serve its immediate context, oldest first.

        Those are its pending or committed, live, untainted turns.

        Raises:
            NotFound / RecordDeleted: the thread.
        """
        if count <= 0:
            return []
        now = time.time()
        with self.env.begin() as txn:
            self._live_thread(txn, owner, thread)
            metas = [
                m
                for m in self._turns_read(txn, self._thread_metas(txn, owner, thread), now)
                if listable(m, now, {PENDING, COMMITTED}, include_tainted=False)
            ][-count:]
            rows = [(m, self._read_payloads(txn, m.rid, False)) for m in metas]
        return self.open_each(rows, lambda m, cts: self.turn_view(m, cts, with_embedding=False))

    def visible_neighbours(
        self,
        owner: str,
        thread: str,
        seqs: Iterable[int],
        visible: Callable[[TurnMeta, float], bool],
        *,
        gone: Collection[int] = frozenset(),
        earlier: bool = True,
        later: bool = True,
    ) -> dict[int, tuple[TurnMeta | None, TurnMeta | None]]:
        """For each seq of a thread: its nearest earlier and later turns that ``visible`` accepts.

        A neighbour is a turn for which ``visible(meta, now)`` holds (as reads
        see it), or None.

        One read transaction. Each walk stops at the first such turn, and a walk's
        answer is shared by every asked seq it passed over (a forgotten range of
        n turns costs O(n) row reads, not O(n^2)): walking forward from ``s`` to
        the first visible turn ``t`` means every row between them is invisible, so
        ``t`` is also the next visible turn of any seq between ``s`` and ``t``.

        Args:
            owner: the thread's owner.
            thread: the thread's id.
            seqs: the asked seqs (need not exist).
            visible: whether a turn counts as a neighbour.
            gone: record numbers the caller knows are not visible (a forget's
                own turns): walks step over them without reading their rows, so
                re-contexting after forgetting a 1,000-turn range reads the two
                turns around it, not the 1,000 rows of the range (twice).
            earlier: look for the earlier neighbour; when False it is None.
            later: look for the later neighbour; when False it is None.
        """
        now = time.time()
        prefix = sk.thread_prefix(owner, thread)
        ordered = sorted(set(seqs))
        before: dict[int, TurnMeta | None] = dict.fromkeys(ordered)
        after: dict[int, TurnMeta | None] = dict.fromkeys(ordered)
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.t.seqs)

            def walk(found: bool, step: Callable[[], bool]) -> TurnMeta | None:
                while found and bytes(cur.key()).startswith(prefix):
                    rid = sk.rid_of(bytes(cur.value()))
                    if rid not in gone:
                        meta = self._turn_read(txn, rid, now)
                        if meta is not None and visible(meta, now):
                            return meta
                    found = step()
                return None

            reach: float = -1.0  # the seq the last forward walk stopped at (inf: the end)
            found: TurnMeta | None = None
            for seq in ordered if later else ():
                if seq >= reach:
                    found = walk(cur.set_range(sk.seq_key(owner, thread, seq + 1)), cur.next)
                    reach = float(found.seq) if found is not None else float("inf")
                after[seq] = found
            reach, found = float("inf"), None  # backward: the seq the last walk stopped at
            for seq in reversed(ordered) if earlier else ():
                if seq <= reach:
                    at = cur.set_range(sk.seq_key(owner, thread, seq))
                    found = walk(cur.prev() if at else cur.last(), cur.prev)
                    reach = float(found.seq) if found is not None else float("-inf")
                before[seq] = found
        return {seq: (before[seq], after[seq]) for seq in ordered}

    def owner_turns(self, owner: str) -> list[TurnMeta]:
        """Every stored turn of an owner (one read transaction), as reads see them."""
        now = time.time()
        with self.env.begin() as txn:
            return self._turns_read(txn, self._owner_turn_metas(txn, owner), now)

    def thread_turns(self, owner: str, thread: str) -> list[TurnMeta]:
        """Every stored turn of a thread in seq order (deleted rows included), as reads see them."""
        now = time.time()
        with self.env.begin() as txn:
            metas = self._thread_metas(txn, owner, thread, with_deleted=True)
            return self._turns_read(txn, metas, now)

    def embeddings(self, metas: Sequence[TurnMeta]) -> tuple[list[int], npt.NDArray[np.float32]]:
        """Decrypt the stored vectors of ``metas``.

        Returns:
            (rids, ``(n, d) float32`` vectors); records whose key is gone or
            whose vector fails authentication (logged by rid) are skipped.
        """
        with self.env.begin() as txn:
            cts = {
                m.rid: ct
                for m in metas
                if (ct := sk.get(txn, self.t.payloads, sk.payload_key(m.rid, PAYLOAD_EMBEDDING)))
            }
        opened = self.open_each(
            ((m, cts[m.rid]) for m in metas if m.rid in cts),
            lambda m, ct: (m.rid, self.open_turn_payload(m, PAYLOAD_EMBEDDING, ct)),
        )
        return stack_vectors(opened)
