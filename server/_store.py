"""The record store: the LMDB data environment, its keystore, and the rules of
appending, committing and forgetting turns.

Layout of a data directory ``DIR``::

    DIR/data/       the data environment (ciphertext and non-content metadata)
    DIR/keystore/   the keystore environment (wrapped keys), never backed up
    DIR/lethe.lock  held (flock) by the one server process using DIR

Named databases of the data environment (all keys are ids or numbers, never
content):

==============  =============================================  ==================================
database        key                                            value
==============  =============================================  ==================================
meta            ascii name                                     store id, next record number
owners          owner                                          JSON {dim, create_time}
threads         owner 0x00 thread                              ThreadMeta JSON
turns           rid (8 bytes BE)                               TurnMeta JSON
seqs            owner 0x00 thread 0x00 seq (8 bytes BE)        rid
owner_records   owner 0x00 rid                                 empty
payloads        rid + payload code (c, e)                      ciphertext (see shredder)
titles          owner 0x00 thread                              ciphertext of the title
expiry          expire time µs (8 BE) + rid                    empty: the pending-expiry queue
tombstones      resource name                                  JSON {time, reason, deletion}
deletions       owner 0x00 deletion id                         deletion-log entry JSON (ids only)
requests        owner 0x00 thread 0x00 request id              JSON list of rids (idempotency)
tokens          SHA-256 digest of the bearer token             JSON principal
memories        rid (8 bytes BE)                               MemMeta JSON (current version)
memory_ids      owner 0x00 memory id                           rid
mpayloads       rid + version (8 BE) + code (m, e)             ciphertext of one memory version
lineage_down    source name 0x00 derivative name               versions (see server._lineage)
lineage_up      derivative name 0x00 source name               versions
events          owner 0x00 event number (8 bytes BE)           event JSON (ids only)
slots           owner 0x00 keyed digest of kind/slot/scope     rid of the memory holding it
manifests       owner 0x00 manifest id                         JSON {refs, create_time, thread}
==============  =============================================  ==================================

Thread rules: every write goes through :class:`server._writer.Writer` (one
thread); read methods open their own read transactions and are safe from any
thread. Forgetting follows ARCHITECTURE.md "Lineage and deletion": (1) one
transaction writes tombstones and a deletion-log entry, (2) the caller removes
index entries, (3) keys are destroyed in the keystore and synced, (4) the
ciphertext rows are purged and the log entry is marked complete. A crash
between steps is resumed at start-up from the log (:meth:`Store.resume_deletions`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import lmdb
import numpy as np
import numpy.typing as npt

from server._lineage import add_edges, children_of, remove_edges_from, remove_edges_of
from server._memories import MemoryMixin, MemoryView, memory_ring
from server._records import (
    COMMITTED,
    PAYLOAD_CONTENT,
    PAYLOAD_EMBEDDING,
    PAYLOAD_MEMORY,
    PAYLOAD_TITLE,
    PENDING,
    SEALED,
    MemMeta,
    ThreadMeta,
    TurnMeta,
    expiry_key,
    memory_id_key,
    memory_payload_key,
    owner_prefix,
    pack_content,
    payload_key,
    rid_from_key,
    rid_key,
    seq_key,
    thread_key,
    unpack_content,
)
from server._repairs import REPAIR_CONTINUED, RepairMixin
from server._visibility import check_readable, effective_state
from server._writer import WriteOp, Writer
from server.errors import (
    AlreadyExists,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    LetheError,
    NotFound,
    RecordDeleted,
)
from shredder import (
    AssociatedData,
    EnvironmentConfigError,
    IntegrityError,
    KekRing,
    KeyNotFoundError,
    Keystore,
    RingRef,
    check_kek_placement,
    default_kek_path,
    open_durable_env,
)

_log = logging.getLogger(__name__)
KEK_ENV = "LETHE_KEK"
DATA_MAP_SIZE = 64 << 30  # bytes of address space; the file grows as needed
KEYSTORE_MAP_SIZE = 8 << 30
_DBS = (
    "meta",
    "owners",
    "threads",
    "turns",
    "seqs",
    "owner_records",
    "payloads",
    "titles",
    "expiry",
    "tombstones",
    "deletions",
    "requests",
    "tokens",
    "memories",
    "memory_ids",
    "mpayloads",
    "lineage_down",
    "lineage_up",
    "events",
    "slots",
    "manifests",
)
EVENT_RETENTION = 7 * 24 * 3600.0  # seconds events are kept for Watch(after=...)
DESTINATIONS = ("lmdb", "index", "lexical", "keystore", "cache")
_OPEN: dict[Path, Store] = {}
_OPEN_GUARD = threading.Lock()


def open_store_for(data_dir: Path) -> Store | None:
    """The Store this process has open on ``data_dir``, if any (LMDB allows one
    handle per environment and process, so an in-process backup must reuse it)."""
    with _OPEN_GUARD:
        return _OPEN.get(data_dir.resolve())


class StoreLockedError(LetheError):
    """Another process holds the data directory."""


@dataclass(slots=True)
class TurnDraft:
    """A validated turn to append.

    Attributes:
        embedding: ``(d,) float32`` finite vector, or None to let the server embed.
        pending_ttl: seconds a pending turn lives (ignored when ``commit``).
        time: when it was said, seconds since the epoch, or None for now.
    """

    role: int
    speaker: str
    text: str
    time: float | None
    embedding: npt.NDArray[np.float32] | None
    context_manifest: str
    context_refs: list[tuple[str, int]]
    commit: bool
    pending_ttl: float


@dataclass(slots=True)
class TurnView:
    """A readable turn: metadata plus decrypted content."""

    meta: TurnMeta
    text: str
    speaker: str
    embedding: npt.NDArray[np.float32] | None = None


@dataclass(slots=True)
class ThreadView:
    meta: ThreadMeta
    title: str


@dataclass(slots=True)
class DeletionPlan:
    """What a forget resolved to (step 1's output), ids only."""

    entry: dict[str, Any]
    rids: list[int]
    pending_threads: set[str] = field(default_factory=set)


def _now() -> float:
    return time.time()


def data_paths(data_dir: Path) -> tuple[Path, Path]:
    """``(data environment dir, keystore dir)`` of a data directory."""
    return data_dir / "data", data_dir / "keystore"


def load_kek(data_dir: Path, store_id: str, kek_file: Path | None, *, create: bool) -> KekRing:
    """Load the KEK ring for a store.

    ``LETHE_KEK`` (tests) wins; otherwise ``kek_file`` or the default path in
    the user's config directory, never inside the data directory.

    Raises:
        EnvironmentConfigError: KEK inside ``data_dir``, missing (when not
            creating), unreadable or too permissive.
    """
    env_value = os.environ.get(KEK_ENV)
    if env_value:
        return KekRing.from_env(env_value)
    path = kek_file if kek_file is not None else default_kek_path(store_id)
    check_kek_placement(path, [data_dir])
    return KekRing.load_or_create(path, create=create)


class Store(MemoryMixin, RepairMixin):
    """The data environment, the keystore and the writer for one data directory.

    Args:
        data_dir: The data directory (created if missing).
        kek_file: The KEK file; default in the user's config directory.
        lock: Take the exclusive directory lock (a serving process must).

    Raises:
        StoreLockedError: another process holds ``data_dir``.
        EnvironmentConfigError: LMDB flags or KEK placement are unsafe, or the
            data environment belongs to another keystore.
    """

    def __init__(self, data_dir: Path, *, kek_file: Path | None = None, lock: bool = True) -> None:
        self.data_dir = data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = None
        if lock:
            self._lock_fd = _acquire_lock(self.data_dir / "lethe.lock")
        data_path, ks_path = data_paths(self.data_dir)
        first_start = Keystore.read_store_id(ks_path) is None
        store_id = Keystore.init_store_id(ks_path)
        self.kek = load_kek(self.data_dir, store_id, kek_file, create=first_start)
        self.keystore = Keystore(ks_path, self.kek, map_size=KEYSTORE_MAP_SIZE)
        data_path.mkdir(parents=True, exist_ok=True)
        self.env = open_durable_env(data_path, map_size=DATA_MAP_SIZE, max_dbs=len(_DBS) + 2)
        with self.env.begin(write=True) as txn:
            self.db = {name: self.env.open_db(name.encode(), txn=txn) for name in _DBS}
            stored = _get(txn, b"store_id", db=self.db["meta"])
            if stored is None:
                txn.put(b"store_id", store_id.encode(), db=self.db["meta"])
                txn.put(b"next_rid", b"1", db=self.db["meta"])
            elif stored.decode() != store_id:
                raise EnvironmentConfigError(
                    "the data environment belongs to another keystore; restore only "
                    "beside the keystore it was backed up from"
                )
        self.store_id = store_id
        self.writer = Writer(self.env, self.keystore)
        with _OPEN_GUARD:
            _OPEN[self.data_dir] = self

    def close(self) -> None:
        """Stop the writer (finishing queued writes) and close both environments."""
        with _OPEN_GUARD:
            if _OPEN.get(self.data_dir) is self:
                del _OPEN[self.data_dir]
        self.writer.close()
        self.env.close()
        self.keystore.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ crypto

    def _seal(
        self,
        txn: lmdb.Transaction,
        ring: RingRef,
        key_id: str,
        ad: AssociatedData,
        plaintext: bytes,
    ) -> bytes:
        del txn
        return self.keystore.seal(ring, key_id, ad, plaintext)

    def _open(
        self, ring: RingRef, key_id: str, ad: AssociatedData, ciphertext: bytes, name: str
    ) -> bytes:
        try:
            return self.keystore.open(ring, key_id, ad, ciphertext)
        except KeyNotFoundError:
            raise RecordDeleted(f"{name} was deleted") from None
        except IntegrityError:
            raise DataLoss(f"stored ciphertext of {name} failed authentication") from None

    def open_turn_payload(self, meta: TurnMeta, payload_type: str, ciphertext: bytes) -> bytes:
        """Decrypt one payload of a turn.

        Raises:
            RecordDeleted: its record key was destroyed.
            DataLoss: the ciphertext fails authentication while its key exists.
        """
        ad = AssociatedData(meta.owner, meta.name, meta.version, payload_type)
        return self._open(
            RingRef(meta.owner, meta.ring_thread), meta.key_id, ad, ciphertext, meta.name
        )

    # ------------------------------------------------------------------ owners / tokens

    def owner_dim(self, owner: str) -> int | None:
        """The owner's fixed vector dimension, or None before its first vector."""
        with self.env.begin() as txn:
            raw = _get(txn, owner.encode(), db=self.db["owners"])
        if raw is None:
            return None
        dim = json.loads(raw).get("dim")
        return int(dim) if dim else None

    def put_token(self, digest: bytes, principal: dict[str, Any]) -> None:
        """Store a token digest (used by ``lethe token create``, any process)."""
        with self.env.begin(write=True) as txn:
            txn.put(digest, json.dumps(principal).encode(), db=self.db["tokens"])

    def get_principal(self, digest: bytes) -> dict[str, Any] | None:
        with self.env.begin() as txn:
            raw = _get(txn, digest, db=self.db["tokens"])
        return None if raw is None else dict(json.loads(raw))

    # ------------------------------------------------------------------ threads

    def create_thread(self, owner: str, thread: str, title: str) -> ThreadView:
        """Create a thread (and its ring key).

        Raises:
            AlreadyExists: a live thread has that id.
        """
        now = _now()
        ring = RingRef(owner, thread)
        title_key = "title-" + secrets.token_hex(8)
        name = f"owners/{owner}/threads/{thread}"

        def apply(txn: lmdb.Transaction) -> ThreadView:
            key = thread_key(owner, thread)
            if _get(txn, key, db=self.db["threads"]) is not None:
                raise AlreadyExists(f"{name} already exists")
            stone = _get(txn, name.encode(), db=self.db["tombstones"])
            last_seq = int(json.loads(stone).get("last_seq", 0)) if stone else 0
            txn.delete(name.encode(), db=self.db["tombstones"])
            if _get(txn, owner.encode(), db=self.db["owners"]) is None:
                owner_rec = {"dim": 0, "create_time": now}
                txn.put(owner.encode(), json.dumps(owner_rec).encode(), db=self.db["owners"])
            txn.delete(f"owners/{owner}".encode(), db=self.db["tombstones"])
            # A forgotten thread's id may be used again; its turns number on
            # after the old ones, so an old turn name stays RECORD_DELETED.
            meta = ThreadMeta(owner, thread, "CONVERSATION", now, now, last_seq, title_key)
            txn.put(key, meta.encode(), db=self.db["threads"])
            ad = AssociatedData(owner, name, 1, PAYLOAD_TITLE)
            txn.put(key, self._seal(txn, ring, title_key, ad, title.encode()), db=self.db["titles"])
            return ThreadView(meta, title)

        return self.writer.run(WriteOp(apply, create_keys=[(ring, title_key)]))

    def _thread_view(self, meta: ThreadMeta, ciphertext: bytes | None) -> ThreadView:
        title = ""
        if ciphertext is not None:
            name = f"owners/{meta.owner}/threads/{meta.thread}"
            ad = AssociatedData(meta.owner, name, 1, PAYLOAD_TITLE)
            ring = RingRef(meta.owner, meta.thread)
            title = self._open(ring, meta.title_key, ad, ciphertext, name).decode()
        return ThreadView(meta, title)

    def get_thread(self, owner: str, thread: str) -> ThreadView:
        """Read a thread.

        Raises:
            RecordDeleted: it was forgotten.
            NotFound: it never existed.
        """
        key = thread_key(owner, thread)
        with self.env.begin() as txn:
            meta = self._live_thread(txn, owner, thread)
            ct = _get(txn, key, db=self.db["titles"]) if meta.title_key else None
        return self._thread_view(meta, ct)

    def _live_thread(self, txn: lmdb.Transaction, owner: str, thread: str) -> ThreadMeta:
        """The thread's metadata if it exists and is not being forgotten.

        Raises:
            RecordDeleted: forgotten (tombstone) or being forgotten. NotFound: never existed.
        """
        raw = _get(txn, thread_key(owner, thread), db=self.db["threads"])
        name = f"owners/{owner}/threads/{thread}"
        if raw is None:
            self._raise_missing(txn, name)
        meta = ThreadMeta.decode(raw)
        if meta.deleted:
            raise RecordDeleted(f"{name} was deleted")
        return meta

    def list_threads(
        self, owner: str, after: str, limit: int, include_repairs: bool = False
    ) -> tuple[list[ThreadView], str]:
        """Threads of ``owner`` ordered by id, starting after id ``after``.

        Returns:
            (threads, next id to resume after or "" at the end).
        """
        prefix = owner_prefix(owner)
        start = prefix + after.encode() + b"\x01" if after else prefix
        rows: list[tuple[ThreadMeta, bytes | None]] = []
        more = False
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["threads"])
            if cur.set_range(start):
                for key, raw in cur:
                    if not key.startswith(prefix):
                        break
                    meta = ThreadMeta.decode(raw)
                    if meta.deleted or (meta.kind == "REPAIR" and not include_repairs):
                        continue
                    if len(rows) == limit:
                        more = True
                        break
                    rows.append((meta, _get(txn, key, db=self.db["titles"])))
        views = [self._thread_view(meta, ct if meta.title_key else None) for meta, ct in rows]
        return views, (views[-1].meta.thread if more and views else "")

    def _raise_missing(self, txn: lmdb.Transaction, name: str) -> NoReturn:
        if _get(txn, name.encode(), db=self.db["tombstones"]) is not None:
            raise RecordDeleted(f"{name} was deleted")
        raise NotFound(f"{name} not found")

    # ------------------------------------------------------------------ turns

    def find_request(self, owner: str, thread: str, request_id: str) -> list[int] | None:
        """Rids recorded for an idempotent AppendTurns, or None."""
        key = thread_key(owner, thread) + b"\x00" + request_id.encode()
        with self.env.begin() as txn:
            raw = _get(txn, key, db=self.db["requests"])
        return None if raw is None else [int(r) for r in json.loads(raw)]

    def append_turns(
        self, owner: str, thread: str, drafts: Sequence[TurnDraft], request_id: str
    ) -> tuple[list[TurnMeta], bool]:
        """Append turns at the end of a thread in one transaction.

        Drafts must already carry their embeddings (or None when the owner has
        no embedder and the client sent none).

        Returns:
            (the stored turns' metadata, True if this was a retry of
            ``request_id`` that appended nothing).

        Raises:
            NotFound / RecordDeleted: the thread does not exist / was forgotten.
            InvalidArgument: an embedding's dimension differs from the owner's
                (reason ``DIMENSION_MISMATCH``).
        """
        now = _now()
        ring = RingRef(owner, thread)
        key_ids = [secrets.token_hex(8) for _ in drafts]
        tkey = thread_key(owner, thread)
        req_key = tkey + b"\x00" + request_id.encode() if request_id else b""

        def apply(txn: lmdb.Transaction) -> tuple[list[TurnMeta], bool]:
            if req_key:
                prior = _get(txn, req_key, db=self.db["requests"])
                if prior is not None:
                    return self._metas(txn, [int(r) for r in json.loads(prior)]), True
            tmeta = self._live_thread(txn, owner, thread)
            repair = tmeta.kind == "REPAIR"
            if repair and tmeta.repair_state != REPAIR_CONTINUED:
                name = f"owners/{owner}/threads/{thread}"
                raise FailedPrecondition(
                    f"{name} is {tmeta.repair_state}: reopen it to append",
                    reason="REPAIR_NOT_CONTINUED",
                    subject=name,
                )
            self._check_dims(txn, owner, drafts, now)
            next_rid = int(_get(txn, b"next_rid", db=self.db["meta"]) or b"1")
            metas: list[TurnMeta] = []
            for i, draft in enumerate(drafts):
                rid = next_rid + i
                seq = tmeta.last_seq + 1 + i
                state = SEALED if repair else COMMITTED if draft.commit else PENDING
                meta = TurnMeta(
                    rid=rid,
                    owner=owner,
                    thread=thread,
                    seq=seq,
                    role=draft.role,
                    state=state,
                    version=1,
                    time=draft.time if draft.time is not None else now,
                    create_time=now,
                    expire_time=0.0 if state != PENDING else now + draft.pending_ttl,
                    key_id=key_ids[i],
                    has_embedding=draft.embedding is not None,
                    context_manifest=draft.context_manifest,
                    context_refs=list(draft.context_refs),
                )
                if meta.context_refs or meta.context_manifest:
                    lineage = self._response_lineage(txn, meta, now)
                    if meta.context_refs:
                        meta.context_refs = lineage[: len(meta.context_refs)]
                self._write_turn(txn, meta, draft)
                metas.append(meta)
            txn.put(b"next_rid", str(next_rid + len(drafts)).encode(), db=self.db["meta"])
            tmeta.last_seq += len(drafts)
            tmeta.update_time = now
            txn.put(tkey, tmeta.encode(), db=self.db["threads"])
            if req_key:
                rids = json.dumps([m.rid for m in metas]).encode()
                txn.put(req_key, rids, db=self.db["requests"])
            return metas, False

        metas, retried = self.writer.run(
            WriteOp(apply, create_keys=[(ring, kid) for kid in key_ids])
        )
        if retried:  # the keys made for this attempt hold nothing: destroy them
            self.writer.run(WriteOp(_noop, destroy_keys=[(ring, kid) for kid in key_ids]))
        return metas, retried

    def _response_lineage(
        self, txn: lmdb.Transaction, meta: TurnMeta, now: float
    ) -> list[tuple[str, int]]:
        """Write a response's lineage (its ``context_refs`` plus its
        ``context_manifest``'s refs) and taint it at once if any of them is
        already gone: it was produced from deleted material.

        Returns:
            The refs with version 0 replaced by the record's current version.
        """
        refs: list[tuple[str, int]] = []
        wanted = list(meta.context_refs)
        if meta.context_manifest:
            manifest_id = meta.context_manifest.rsplit("/", 1)[-1]
            raw = _get(txn, f"{meta.owner}\x00{manifest_id}".encode(), db=self.db["manifests"])
            if raw is None:
                raise InvalidArgument("context_manifest", f"{meta.context_manifest} not found")
            wanted += [(n, int(v)) for n, v in json.loads(raw)["refs"]]
        for name, version in dict.fromkeys(wanted):
            source = self.resolve(txn, name)
            # A later version (a correction) does not taint; a deletion does.
            alive = (
                source is not None
                and not source.tainted
                and effective_state(source, now) is not None
            )
            if not alive:
                meta.tainted = True
            refs.append((name, version or (source.version if source is not None else 0)))
        add_edges(
            txn, self.db["lineage_down"], self.db["lineage_up"], meta.name, meta.version, refs
        )
        return refs

    def _check_dims(
        self, txn: lmdb.Transaction, owner: str, drafts: Sequence[TurnDraft], now: float
    ) -> None:
        dims = {d.embedding.shape[0] for d in drafts if d.embedding is not None}
        if not dims:
            return
        raw = _get(txn, owner.encode(), db=self.db["owners"])
        rec: dict[str, Any] = json.loads(raw) if raw else {"dim": 0, "create_time": now}
        have = int(rec.get("dim") or 0)
        expected = have or min(dims)
        for i, draft in enumerate(drafts):
            if draft.embedding is not None and draft.embedding.shape[0] != expected:
                raise InvalidArgument(
                    f"turns[{i}].embedding",
                    f"dimension {draft.embedding.shape[0]} differs from the owner's {expected}",
                    reason="DIMENSION_MISMATCH",
                )
        if not have:
            rec["dim"] = expected
            txn.put(owner.encode(), json.dumps(rec).encode(), db=self.db["owners"])

    def _write_turn(self, txn: lmdb.Transaction, meta: TurnMeta, draft: TurnDraft) -> None:
        ring = RingRef(meta.owner, meta.thread)
        rk = rid_key(meta.rid)
        payloads = [(PAYLOAD_CONTENT, pack_content(draft.speaker, draft.text))]
        if draft.embedding is not None:
            payloads.append((PAYLOAD_EMBEDDING, draft.embedding.astype("<f4").tobytes()))
        for ptype, plain in payloads:
            ad = AssociatedData(meta.owner, meta.name, meta.version, ptype)
            ct = self._seal(txn, ring, meta.key_id, ad, plain)
            txn.put(payload_key(meta.rid, ptype), ct, db=self.db["payloads"])
        txn.put(rk, meta.encode(), db=self.db["turns"])
        txn.put(seq_key(meta.owner, meta.thread, meta.seq), rk, db=self.db["seqs"])
        txn.put(owner_prefix(meta.owner) + rk, b"", db=self.db["owner_records"])
        if meta.state == PENDING:
            txn.put(expiry_key(meta.expire_time, meta.rid), b"", db=self.db["expiry"])

    def _metas(self, txn: lmdb.Transaction, rids: Sequence[int]) -> list[TurnMeta]:
        out = []
        for rid in rids:
            raw = _get(txn, rid_key(rid), db=self.db["turns"])
            if raw is not None:
                out.append(TurnMeta.decode(raw))
        return out

    def metas(self, rids: Sequence[int]) -> list[TurnMeta]:
        """Current metadata of ``rids`` in one read transaction (missing ones skipped)."""
        with self.env.begin() as txn:
            return self._metas(txn, rids)

    def payloads(self, rids: Sequence[int], payload_type: str) -> dict[int, bytes]:
        """Ciphertexts of one payload type for ``rids`` in one read transaction."""
        out: dict[int, bytes] = {}
        with self.env.begin() as txn:
            for rid in rids:
                ct = _get(txn, payload_key(rid, payload_type), db=self.db["payloads"])
                if ct is not None:
                    out[rid] = ct
        return out

    def fetch(
        self, rids: Sequence[int], payload_types: Sequence[str]
    ) -> dict[int, tuple[TurnMeta | MemMeta, dict[str, bytes]]]:
        """Metadata and ciphertexts of ``rids`` in ONE read transaction (the
        recheck of search hits); rids without a row are absent from the result.

        For a memory, a non-empty ``payload_types`` reads its current version's
        content payload (key ``"memory"``).
        """
        out: dict[int, tuple[TurnMeta | MemMeta, dict[str, bytes]]] = {}
        with self.env.begin() as txn:
            for rid in rids:
                raw = _get(txn, rid_key(rid), db=self.db["turns"])
                cts: dict[str, bytes] = {}
                if raw is None:
                    raw = _get(txn, rid_key(rid), db=self.db["memories"])
                    if raw is None:
                        continue
                    meta = MemMeta.decode(raw)
                    if payload_types:
                        ct = _get(
                            txn,
                            memory_payload_key(rid, meta.version, PAYLOAD_MEMORY),
                            db=self.db["mpayloads"],
                        )
                        if ct is not None:
                            cts[PAYLOAD_MEMORY] = ct
                    out[rid] = (meta, cts)
                    continue
                for ptype in payload_types:
                    ct = _get(txn, payload_key(rid, ptype), db=self.db["payloads"])
                    if ct is not None:
                        cts[ptype] = ct
                out[rid] = (TurnMeta.decode(raw), cts)
        return out

    def view_of(self, meta: TurnMeta | MemMeta, cts: dict[str, bytes]) -> TurnView | MemoryView:
        """Decrypt a fetched row (see :meth:`fetch`).

        Raises:
            RecordDeleted: its key was destroyed. DataLoss: authentication failed.
        """
        if isinstance(meta, MemMeta):
            return self.memory_view(meta, meta.version, cts.get(PAYLOAD_MEMORY))
        return self.turn_view(meta, cts, with_embedding=False)

    def turn_view(self, meta: TurnMeta, cts: dict[str, bytes], with_embedding: bool) -> TurnView:
        """Decrypt a turn's payloads (``cts`` maps payload type to ciphertext).

        Raises:
            RecordDeleted: its key was destroyed. DataLoss: a ciphertext is corrupt
                or missing while the record is live.
        """
        if PAYLOAD_CONTENT not in cts:
            raise RecordDeleted(f"{meta.name} was deleted")
        try:
            speaker, text = unpack_content(
                self.open_turn_payload(meta, PAYLOAD_CONTENT, cts[PAYLOAD_CONTENT])
            )
        except (ValueError, UnicodeDecodeError):
            raise DataLoss(f"stored content of {meta.name} is malformed") from None
        emb = None
        if with_embedding and meta.has_embedding and PAYLOAD_EMBEDDING in cts:
            raw = self.open_turn_payload(meta, PAYLOAD_EMBEDDING, cts[PAYLOAD_EMBEDDING])
            emb = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        return TurnView(meta, text, speaker, emb)

    def _read_payloads(
        self, txn: lmdb.Transaction, rid: int, with_embedding: bool
    ) -> dict[str, bytes]:
        types = [PAYLOAD_CONTENT] + ([PAYLOAD_EMBEDDING] if with_embedding else [])
        out = {}
        for ptype in types:
            ct = _get(txn, payload_key(rid, ptype), db=self.db["payloads"])
            if ct is not None:
                out[ptype] = ct
        return out

    def get_turn(self, owner: str, thread: str, seq: int, with_embedding: bool) -> TurnView:
        """Read one turn through the visibility rules.

        Raises:
            NotFound: never existed. RecordDeleted: deleted or expired.
            FailedPrecondition: sealed. DataLoss: ciphertext fails authentication.
        """
        name = f"owners/{owner}/threads/{thread}/turns/{seq}"
        with self.env.begin() as txn:
            rk = _get(txn, seq_key(owner, thread, seq), db=self.db["seqs"])
            raw = None if rk is None else _get(txn, rk, db=self.db["turns"])
            if raw is None:
                self._raise_missing(txn, name)
            meta = TurnMeta.decode(raw)
            check_readable(meta, _now())
            cts = self._read_payloads(txn, meta.rid, with_embedding)
        return self.turn_view(meta, cts, with_embedding)

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
        from server._visibility import listable

        now = _now()
        prefix = thread_key(owner, thread) + b"\x00"
        rows: list[tuple[TurnMeta, dict[str, bytes]]] = []
        more = False
        with self.env.begin() as txn:
            self._live_thread(txn, owner, thread)
            cur = txn.cursor(db=self.db["seqs"])
            if cur.set_range(seq_key(owner, thread, after_seq + 1)):
                for key, rk in cur:
                    if not key.startswith(prefix):
                        break
                    raw = _get(txn, rk, db=self.db["turns"])
                    if raw is None:
                        continue
                    meta = TurnMeta.decode(raw)
                    if not listable(meta, now, states, include_tainted):
                        continue
                    if len(rows) == limit:
                        more = True
                        break
                    rows.append((meta, self._read_payloads(txn, meta.rid, with_embedding)))
        views = []
        for meta, cts in rows:
            try:
                views.append(self.turn_view(meta, cts, with_embedding))
            except RecordDeleted:  # key shredded under us: it is gone
                continue
        return views, (rows[-1][0].seq if more and rows else 0)

    def owner_turns(self, owner: str) -> Iterator[TurnMeta]:
        """Every stored turn of an owner (one read transaction, materialised)."""
        prefix = owner_prefix(owner)
        metas: list[TurnMeta] = []
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["owner_records"])
            if cur.set_range(prefix):
                for key in cur.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    raw = _get(txn, key[len(prefix) :], db=self.db["turns"])
                    if raw is not None:
                        metas.append(TurnMeta.decode(raw))
        return iter(metas)

    def thread_turns(self, owner: str, thread: str) -> list[TurnMeta]:
        """Every stored turn of a thread in seq order."""
        prefix = thread_key(owner, thread) + b"\x00"
        metas: list[TurnMeta] = []
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["seqs"])
            if cur.set_range(prefix):
                for key, rk in cur:
                    if not key.startswith(prefix):
                        break
                    raw = _get(txn, rk, db=self.db["turns"])
                    if raw is not None:
                        metas.append(TurnMeta.decode(raw))
        return metas

    def embeddings(self, metas: Sequence[TurnMeta]) -> tuple[list[int], npt.NDArray[np.float32]]:
        """Decrypt the stored vectors of ``metas``.

        Returns:
            (rids, ``(n, d) float32`` vectors); records whose key is gone are skipped.
        """
        cts = self.payloads([m.rid for m in metas], PAYLOAD_EMBEDDING)
        rids: list[int] = []
        vecs: list[npt.NDArray[np.float32]] = []
        for meta in metas:
            ct = cts.get(meta.rid)
            if ct is None:
                continue
            try:
                raw = self.open_turn_payload(meta, PAYLOAD_EMBEDDING, ct)
            except RecordDeleted:
                continue
            except DataLoss:  # one corrupt vector must not take the owner's index down
                _log.error("vector of record %d fails authentication; not indexed", meta.rid)
                continue
            rids.append(meta.rid)
            vecs.append(np.frombuffer(raw, dtype="<f4"))
        if not vecs:
            return [], np.zeros((0, 0), dtype=np.float32)
        return rids, np.vstack(vecs).astype(np.float32)

    # ------------------------------------------------------------------ commit

    def commit_turns(self, targets: Sequence[tuple[str, str, int]]) -> list[TurnMeta]:
        """Make pending turns ``COMMITTED`` (idempotent for committed ones).

        Args:
            targets: (owner, thread, seq) triples.

        Returns:
            The turns' metadata after the commit, in request order.

        Raises:
            NotFound / RecordDeleted: a turn never existed / is deleted or expired.
            FailedPrecondition: a turn is sealed.
        """

        def apply(txn: lmdb.Transaction) -> list[TurnMeta]:
            now = _now()
            out = []
            for owner, thread, seq in targets:
                name = f"owners/{owner}/threads/{thread}/turns/{seq}"
                rk = _get(txn, seq_key(owner, thread, seq), db=self.db["seqs"])
                raw = None if rk is None else _get(txn, rk, db=self.db["turns"])
                if raw is None:
                    self._raise_missing(txn, name)
                meta = TurnMeta.decode(raw)
                check_readable(meta, now)
                if meta.state == PENDING:
                    txn.delete(expiry_key(meta.expire_time, meta.rid), db=self.db["expiry"])
                    meta.state = COMMITTED
                    meta.expire_time = 0.0
                    txn.put(rid_key(meta.rid), meta.encode(), db=self.db["turns"])
                out.append(meta)
            return out

        return self.writer.run(WriteOp(apply))

    # ------------------------------------------------------------------ forget

    def plan_forget(
        self,
        owner: str,
        turns: Sequence[tuple[str, int]],
        threads: Sequence[str],
        whole_owner: bool,
        reason: str,
        request_time: float,
        *,
        memories: Sequence[str] = (),
        delete_responses: bool = False,
        extra_rings: Sequence[str] = (),
        conclude_repair: tuple[str, str] | None = None,
    ) -> DeletionPlan:
        """Step 1 of a forget, in one transaction: tombstones for the targets and
        every transitive descendant, tainted responses, events, and the
        deletion-log entry.

        Cascade (ARCHITECTURE.md, "Lineage and deletion"): every memory derived
        from a deleted record is deleted; if it had sources that survive, a
        ``REBUILD_REQUESTED`` event names them. A turn whose ``context_refs``
        name a deleted record (an assistant response) becomes ``tainted``, or is
        deleted (and cascades) when ``delete_responses``.

        Args:
            turns: (thread, seq) of single turns. threads: thread ids.
            whole_owner: forget every thread and memory of the owner.
            memories: memory ids.
            extra_rings: thread ids whose rings are destroyed without the
                thread being forgotten (a repair concluded with DESTROY).
            conclude_repair: (repair thread id, outcome) marked ``CONCLUDED``
                in the same transaction, its title removed.

        Raises:
            NotFound / RecordDeleted: a named record never existed / is already
                gone (nothing is deleted).
        """
        deletion_id = _deletion_id()

        def apply(txn: lmdb.Transaction) -> DeletionPlan:
            now = _now()
            plan = _PlanState(self, txn, owner, now, deletion_id, reason)
            plan.rings.extend(extra_rings)
            if conclude_repair is not None:
                repair_id, outcome = conclude_repair
                rmeta = self._live_thread(txn, owner, repair_id)
                rmeta.repair_state, rmeta.repair_outcome = "CONCLUDED", outcome
                rmeta.title_key, rmeta.update_time = "", now
                txn.put(thread_key(owner, repair_id), rmeta.encode(), db=self.db["threads"])
                txn.delete(thread_key(owner, repair_id), db=self.db["titles"])
            thread_ids = list(threads)
            if whole_owner:
                plan.targets.append(f"owners/{owner}")
                thread_ids.extend(self._owner_thread_ids(txn, owner))
            for thread in list(dict.fromkeys(thread_ids)):
                name = f"owners/{owner}/threads/{thread}"
                raw_thread = _get(txn, thread_key(owner, thread), db=self.db["threads"])
                if raw_thread is None:
                    self._raise_missing(txn, name)
                tmeta = ThreadMeta.decode(raw_thread)
                if tmeta.deleted:  # another forget is finishing it
                    if whole_owner:
                        thread_ids.remove(thread)
                        continue
                    raise RecordDeleted(f"{name} was deleted")
                tmeta.deleted = True
                txn.put(thread_key(owner, thread), tmeta.encode(), db=self.db["threads"])
                if not whole_owner:
                    plan.targets.append(name)
                    plan.rings.append(thread)
                self._tombstone(txn, name, now, deletion_id, reason, last_seq=tmeta.last_seq)
                for meta in self._thread_metas(txn, owner, thread):
                    plan.delete_turn(meta, key_in_ring=True)
                if tmeta.kind == "REPAIR":
                    # The repair's ring holds the sealed stretch's keys and its
                    # sealed memories' keys: they go with it.
                    for meta in self._thread_metas(txn, owner, tmeta.repair_source):
                        if meta.key_ring == thread:
                            plan.delete_turn(meta, key_in_ring=False)
                            plan.touched_threads.add(tmeta.repair_source)
                    for sealed_mem in self._owner_memory_metas(txn, owner):
                        if sealed_mem.ring_thread == thread and not sealed_mem.deleted:
                            plan.delete_memory(sealed_mem)
            plan.done_threads = set(thread_ids)
            for thread, seq in turns:
                if thread in plan.done_threads:
                    continue
                name = f"owners/{owner}/threads/{thread}/turns/{seq}"
                found = self.resolve(txn, name)
                if not isinstance(found, TurnMeta):
                    self._raise_missing(txn, name)
                plan.targets.append(name)
                if not found.deleted:
                    plan.delete_turn(found, key_in_ring=False)
                    plan.touched_threads.add(thread)
            memory_ids = list(memories)
            if whole_owner:
                memory_ids.extend(m.memory_id for m in self._owner_memory_metas(txn, owner))
            for memory_id in dict.fromkeys(memory_ids):
                name = f"owners/{owner}/memories/{memory_id}"
                mem = self._mem_by_id(txn, owner, memory_id)
                if mem is None:
                    self._raise_missing(txn, name)
                if mem.deleted:
                    if whole_owner:
                        continue
                    raise RecordDeleted(f"{name} was deleted")
                if not whole_owner:
                    plan.targets.append(name)
                plan.delete_memory(mem)
            plan.cascade(delete_responses)
            for thread in plan.touched_threads - plan.done_threads:
                raw_thread = _get(txn, thread_key(owner, thread), db=self.db["threads"])
                if raw_thread is not None:
                    tmeta = ThreadMeta.decode(raw_thread)
                    tmeta.last_deletion_time = now
                    txn.put(thread_key(owner, thread), tmeta.encode(), db=self.db["threads"])
            if whole_owner:
                self._tombstone(txn, f"owners/{owner}", now, deletion_id, reason)
            entry = self._write_plan(txn, plan, request_time, whole_owner)
            return DeletionPlan(entry, plan.rids + plan.memory_rids + plan.tainted_rids, set())

        return self.writer.run(WriteOp(apply))

    def _plan_state(self, txn: lmdb.Transaction, owner: str, now: float, reason: str) -> _PlanState:
        """A fresh deletion plan inside the caller's write transaction."""
        return _PlanState(self, txn, owner, now, _deletion_id(), reason)

    def _write_plan(
        self,
        txn: lmdb.Transaction,
        plan: _PlanState,
        request_time: float,
        whole_owner: bool = False,
    ) -> dict[str, Any]:
        """Write a plan's events and deletion-log entry; returns the entry."""
        entry = plan.entry(whole_owner, request_time)
        for event in plan.events:
            self._append_event(txn, plan.owner, event, plan.now, entry)
        txn.put(
            _deletion_key(plan.owner, plan.deletion_id),
            json.dumps(entry).encode(),
            db=self.db["deletions"],
        )
        return entry

    def _owner_thread_ids(self, txn: lmdb.Transaction, owner: str) -> list[str]:
        out = []
        cur = txn.cursor(db=self.db["threads"])
        prefix = owner_prefix(owner)
        if cur.set_range(prefix):
            for raw_key in cur.iternext(keys=True, values=False):
                key = bytes(raw_key)
                if not key.startswith(prefix):
                    break
                out.append(key[len(prefix) :].decode())
        return out

    def _owner_memory_metas(self, txn: lmdb.Transaction, owner: str) -> list[MemMeta]:
        out = []
        prefix = f"{owner}\x00".encode()
        cur = txn.cursor(db=self.db["memory_ids"])
        if cur.set_range(prefix):
            for raw_key, rk in cur:
                if not bytes(raw_key).startswith(prefix):
                    break
                raw = _get(txn, bytes(rk), db=self.db["memories"])
                if raw is not None:
                    out.append(MemMeta.decode(raw))
        return out

    def _append_event(
        self,
        txn: lmdb.Transaction,
        owner: str,
        event: dict[str, Any],
        now: float,
        entry: dict[str, Any] | None,
    ) -> None:
        """Append one event (ids only) in the caller's transaction."""
        number = int(_get(txn, b"next_event", db=self.db["meta"]) or b"1")
        txn.put(b"next_event", str(number + 1).encode(), db=self.db["meta"])
        body = {
            "id": str(number),
            "owner": owner,
            "time": now,
            "receipt": f"owners/{owner}/deletions/{entry['id']}" if entry else "",
            **event,
        }
        txn.put(_event_key(owner, number), json.dumps(body).encode(), db=self.db["events"])

    def events(
        self, owner: str, after: int, types: set[str], limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Events of ``owner`` with a number above ``after``, oldest first."""
        prefix = owner_prefix(owner)
        out: list[dict[str, Any]] = []
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["events"])
            if cur.set_range(_event_key(owner, after + 1)):
                for raw_key, raw in cur:
                    if not bytes(raw_key).startswith(prefix) or len(out) >= limit:
                        break
                    event = json.loads(bytes(raw))
                    if not types or event["type"] in types:
                        out.append(event)
        return out

    def prune_events(self, before: float) -> int:
        """Drop events older than ``before`` (seconds since the epoch)."""

        def apply(txn: lmdb.Transaction) -> int:
            dropped = 0
            cur = txn.cursor(db=self.db["events"])
            if not cur.first():
                return 0
            while True:
                event = json.loads(bytes(cur.value()))
                if event["time"] < before:
                    if not cur.delete():
                        break
                    dropped += 1
                    continue
                if not cur.next():
                    break
            return dropped

        return self.writer.run(WriteOp(apply))

    def list_deletions(
        self, owner: str, after: str, limit: int
    ) -> tuple[list[dict[str, Any]], str]:
        """Deletion-log entries of ``owner``, oldest first (ids are time-ordered)."""
        prefix = owner_prefix(owner)
        start = prefix + after.encode() + b"\x01" if after else prefix
        out: list[dict[str, Any]] = []
        more = False
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["deletions"])
            if cur.set_range(start):
                for raw_key, raw in cur:
                    if not bytes(raw_key).startswith(prefix):
                        break
                    if len(out) == limit:
                        more = True
                        break
                    out.append(json.loads(bytes(raw)))
        return out, (out[-1]["id"] if more and out else "")

    def _thread_metas(self, txn: lmdb.Transaction, owner: str, thread: str) -> list[TurnMeta]:
        prefix = thread_key(owner, thread) + b"\x00"
        out = []
        cur = txn.cursor(db=self.db["seqs"])
        if cur.set_range(prefix):
            for key, rk in cur:
                if not bytes(key).startswith(prefix):
                    break
                raw = _get(txn, bytes(rk), db=self.db["turns"])
                if raw is not None:
                    meta = TurnMeta.decode(raw)
                    if not meta.deleted:
                        out.append(meta)
        return out

    def _tombstone(
        self,
        txn: lmdb.Transaction,
        name: str,
        now: float,
        deletion_id: str,
        reason: str,
        **numbering: int,
    ) -> None:
        """Write a tombstone: time, reason, deletion id, and for threads and
        memories the last seq / version, so that an id used again continues the
        numbering and no (name, version) ever names two different contents."""
        stone: dict[str, Any] = {"time": now, "reason": reason, "deletion": deletion_id}
        stone.update(numbering)
        txn.put(name.encode(), json.dumps(stone).encode(), db=self.db["tombstones"])

    def _mark_deleted(
        self,
        txn: lmdb.Transaction,
        meta: TurnMeta | MemMeta,
        now: float,
        deletion_id: str,
        reason: str,
    ) -> None:
        if meta.expire_time:
            txn.delete(expiry_key(meta.expire_time, meta.rid), db=self.db["expiry"])
        meta.deleted = True
        if isinstance(meta, MemMeta):
            self._release_slot(txn, meta)  # the slot is free from the tombstone on
            txn.put(rid_key(meta.rid), meta.encode(), db=self.db["memories"])
            self._tombstone(txn, meta.name, now, deletion_id, reason, last_version=meta.version)
        else:
            txn.put(rid_key(meta.rid), meta.encode(), db=self.db["turns"])
            self._tombstone(txn, meta.name, now, deletion_id, reason)

    def finish_forget(
        self, entry: dict[str, Any], index_done_time: float, shred_horizon: float = 0.0
    ) -> dict[str, Any]:
        """Steps 3 and 4: destroy the keys (synced), purge the rows, close the log entry.

        Args:
            entry: the log entry from :meth:`plan_forget` (or from the log on resume).
            index_done_time: when the index entries were removed (seconds).

        Returns:
            The completed log entry.
        """
        owner = entry["owner"]
        whole_owner = bool(entry["whole_owner"])
        rings = [RingRef(owner, t) for t in entry["rings"]]
        keys = [(RingRef(o, t or None), k) for o, t, k in entry["record_keys"]]

        def apply(txn: lmdb.Transaction) -> dict[str, Any]:
            now = _now()
            for rid in entry["rids"]:
                self._purge_turn(txn, rid)
            for rid in entry.get("memory_rids", []):
                self._purge_memory(txn, rid)
            for thread in entry["threads"]:
                tkey = thread_key(owner, thread)
                txn.delete(tkey, db=self.db["threads"])
                txn.delete(tkey, db=self.db["titles"])
                _delete_prefix(txn, self.db["requests"], tkey + b"\x00")
            if whole_owner:
                txn.delete(owner.encode(), db=self.db["owners"])
            dests = entry["destinations"]
            dests["index"] = {"done": True, "time": index_done_time}
            dests["lexical"] = {"done": True, "time": index_done_time}
            dests["cache"] = {"done": True, "time": index_done_time}
            dests["keystore"] = {"done": True, "time": now}
            dests["lmdb"] = {"done": True, "time": now}
            entry["complete_time"] = now
            entry["shred_horizon_time"] = shred_horizon
            txn.put(
                _deletion_key(owner, entry["id"]),
                json.dumps(entry).encode(),
                db=self.db["deletions"],
            )
            return entry

        return self.writer.run(
            WriteOp(
                apply,
                destroy_keys=keys,
                destroy_rings=rings,
                destroy_owners=[owner] if whole_owner else [],
            )
        )

    def _purge_memory(self, txn: lmdb.Transaction, rid: int) -> None:
        rk = rid_key(rid)
        raw = _get(txn, rk, db=self.db["memories"])
        if raw is None:
            return
        meta = MemMeta.decode(raw)
        _delete_prefix(txn, self.db["mpayloads"], rk)
        txn.delete(rk, db=self.db["memories"])
        txn.delete(memory_id_key(meta.owner, meta.memory_id), db=self.db["memory_ids"])
        txn.delete(owner_prefix(meta.owner) + rk, db=self.db["owner_records"])
        if meta.expire_time:
            txn.delete(expiry_key(meta.expire_time, meta.rid), db=self.db["expiry"])
        remove_edges_of(txn, self.db["lineage_down"], self.db["lineage_up"], meta.name)
        remove_edges_from(txn, self.db["lineage_down"], self.db["lineage_up"], meta.name)

    def _purge_turn(self, txn: lmdb.Transaction, rid: int) -> None:
        rk = rid_key(rid)
        raw = _get(txn, rk, db=self.db["turns"])
        if raw is None:
            return
        meta = TurnMeta.decode(raw)
        remove_edges_of(txn, self.db["lineage_down"], self.db["lineage_up"], meta.name)
        remove_edges_from(txn, self.db["lineage_down"], self.db["lineage_up"], meta.name)
        for code in (b"c", b"e"):
            txn.delete(rk + code, db=self.db["payloads"])
        txn.delete(rk, db=self.db["turns"])
        txn.delete(seq_key(meta.owner, meta.thread, meta.seq), db=self.db["seqs"])
        txn.delete(owner_prefix(meta.owner) + rk, db=self.db["owner_records"])
        if meta.expire_time:
            txn.delete(expiry_key(meta.expire_time, meta.rid), db=self.db["expiry"])

    def rotate(self) -> tuple[int, int, list[int]]:
        """Complete pending shreds now (:meth:`shredder.Keystore.rotate`), on the
        writer thread like every keystore write."""
        return self.writer.run(WriteOp(lambda txn: self.keystore.rotate()))

    def outstanding_deletions(self) -> list[dict[str, Any]]:
        """Deletion-log entries with a destination not yet done."""
        out = []
        with self.env.begin() as txn:
            for _, raw in txn.cursor(db=self.db["deletions"]):
                entry = json.loads(raw)
                if not entry["complete_time"]:
                    out.append(entry)
        return out

    def deletion(self, owner: str, deletion_id: str) -> dict[str, Any] | None:
        with self.env.begin() as txn:
            raw = _get(txn, _deletion_key(owner, deletion_id), db=self.db["deletions"])
        return None if raw is None else dict(json.loads(raw))

    def expired(self, now: float, limit: int = 1000) -> list[TurnMeta | MemMeta]:
        """Pending turns and memories whose ``expire_time`` ≤ ``now`` (seconds)."""
        end = struct_time_key(now)
        rids: list[int] = []
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.db["expiry"])
            if cur.first():
                for key in cur.iternext(keys=True, values=False):
                    if key[:8] > end or len(rids) >= limit:
                        break
                    rids.append(rid_from_key(key[8:]))
            found: list[TurnMeta | MemMeta] = [m for m in self._metas(txn, rids) if not m.deleted]
            for rid in rids:
                raw = _get(txn, rid_key(rid), db=self.db["memories"])
                if raw is not None and not (mem := MemMeta.decode(raw)).deleted:
                    found.append(mem)
            return found

    def records_without_key(self) -> list[TurnMeta | MemMeta]:
        """Live turns and memories whose (current) record key no longer exists
        (after a restore, say)."""
        out: list[TurnMeta | MemMeta] = []
        with self.env.begin() as txn:
            for _, raw in txn.cursor(db=self.db["turns"]):
                meta = TurnMeta.decode(raw)
                if not meta.deleted and not self.keystore.has_record_key(
                    RingRef(meta.owner, meta.ring_thread), meta.key_id
                ):
                    out.append(meta)
            for _, raw in txn.cursor(db=self.db["memories"]):
                mem = MemMeta.decode(raw)
                if not mem.deleted and not self.keystore.has_record_key(
                    memory_ring(mem), mem.key_id
                ):
                    out.append(mem)
        return out

    def threads_without_key(self) -> list[ThreadMeta]:
        """Threads whose ring was destroyed (their title key is gone)."""
        out = []
        with self.env.begin() as txn:
            for _, raw in txn.cursor(db=self.db["threads"]):
                meta = ThreadMeta.decode(raw)
                if meta.title_key and not self.keystore.has_record_key(
                    RingRef(meta.owner, meta.thread), meta.title_key
                ):  # a repair concluded with DESTROY keeps no title key, by design
                    out.append(meta)
        return out

    def pending_stats(self, now: float) -> tuple[int, float]:
        """(number of pending turns, age in seconds of the oldest)."""
        count = 0
        oldest = now
        with self.env.begin() as txn:
            count = txn.stat(self.db["expiry"])["entries"]
            cur = txn.cursor(db=self.db["expiry"])
            for key in cur.iternext(keys=True, values=False):
                meta_raw = _get(txn, key[8:], db=self.db["turns"])
                if meta_raw is not None:
                    oldest = min(oldest, TurnMeta.decode(meta_raw).create_time)
                break
        return count, max(0.0, now - oldest)

    def live_rids(self) -> set[int]:
        """Every non-deleted turn's rid (audit of index drift)."""
        with self.env.begin() as txn:
            return {
                TurnMeta.decode(raw).rid
                for _, raw in txn.cursor(db=self.db["turns"])
                if not TurnMeta.decode(raw).deleted
            }

    def effective(self, meta: TurnMeta) -> str | None:
        return effective_state(meta, _now())


def _get(txn: lmdb.Transaction, key: bytes, db: Any) -> bytes | None:
    """``txn.get`` typed as bytes (py-lmdb returns bytes unless buffers=True)."""
    value = txn.get(key, db=db)
    return None if value is None else bytes(value)


def struct_time_key(t: float) -> bytes:
    return expiry_key(t, 0)[:8]


def _noop(txn: lmdb.Transaction) -> None:
    del txn


def _deletion_id() -> str:
    """A time-ordered deletion id: 12 hex digits of milliseconds, then 8 random."""
    return f"{int(time.time() * 1000):012x}-{secrets.token_hex(4)}"


def _event_key(owner: str, number: int) -> bytes:
    return owner_prefix(owner) + struct.pack(">Q", number)


class _PlanState:
    """Accumulates one forget's step-1 work inside its write transaction."""

    def __init__(
        self,
        store: Store,
        txn: lmdb.Transaction,
        owner: str,
        now: float,
        deletion_id: str,
        reason: str,
    ) -> None:
        self.store = store
        self.txn = txn
        self.owner = owner
        self.now = now
        self.deletion_id = deletion_id
        self.reason = reason
        self.targets: list[str] = []
        self.rids: list[int] = []
        self.memory_rids: list[int] = []
        self.tainted_rids: list[int] = []
        self.record_keys: list[tuple[str, str, str]] = []
        self.rings: list[str] = []
        self.done_threads: set[str] = set()
        self.touched_threads: set[str] = set()
        self.deleted_names: set[str] = set()
        self.queue: list[str] = []
        self.cascaded_memories: list[MemMeta] = []
        self.cascaded = 0
        self.tainted = 0
        self.events: list[dict[str, Any]] = []

    def delete_turn(self, meta: TurnMeta, *, key_in_ring: bool) -> None:
        """Tombstone a turn; its key goes with its thread's ring when ``key_in_ring``."""
        self.rids.append(meta.rid)
        if not key_in_ring or meta.key_ring:  # a sealed turn's key is in its repair's ring
            self.record_keys.append((meta.owner, meta.ring_thread, meta.key_id))
        self.store._mark_deleted(self.txn, meta, self.now, self.deletion_id, self.reason)
        self.deleted_names.add(meta.name)
        self.queue.append(meta.name)

    def delete_memory(self, meta: MemMeta) -> None:
        """Tombstone a memory; every version's record key is destroyed."""
        self.memory_rids.append(meta.rid)
        ring_gone = meta.ring_thread and meta.ring_thread in self.done_threads
        if not ring_gone:
            for key_id in meta.key_ids.values():
                self.record_keys.append((meta.owner, meta.ring_thread, key_id))
        self.store._mark_deleted(self.txn, meta, self.now, self.deletion_id, self.reason)
        self.deleted_names.add(meta.name)
        self.queue.append(meta.name)

    def cascade(self, delete_responses: bool) -> None:
        """Follow lineage down from everything deleted so far (transitively)."""
        store, txn = self.store, self.txn
        explicit = set(self.deleted_names)
        while self.queue:
            source = self.queue.pop()
            for child, _ in list(children_of(txn, store.db["lineage_down"], source)):
                if child in self.deleted_names:
                    continue
                meta = store.resolve(txn, child)
                if meta is None or meta.deleted:
                    continue
                if isinstance(meta, TurnMeta):
                    if delete_responses:
                        self.delete_turn(meta, key_in_ring=meta.thread in self.done_threads)
                        self.touched_threads.add(meta.thread)
                        self.cascaded += 1
                    elif not meta.tainted:
                        meta.tainted = True
                        txn.put(rid_key(meta.rid), meta.encode(), db=store.db["turns"])
                        self.tainted += 1
                        self.tainted_rids.append(meta.rid)
                        # What was derived from a tainted response carries the
                        # forgotten material too: it cascades like a deletion.
                        self.queue.append(meta.name)
                    continue
                self.delete_memory(meta)
                self.cascaded += 1
                self.cascaded_memories.append(meta)
        for meta in self.cascaded_memories:
            surviving = [
                (name, version)
                for name, version in meta.sources
                if name not in self.deleted_names and self._alive(name)
            ]
            if surviving:
                self.events.append(
                    {"type": "REBUILD_REQUESTED", "subject": meta.name, "sources": surviving}
                )
        for name in [*self.targets, *(m.name for m in self.cascaded_memories)]:
            if name not in explicit or name in self.targets:
                self.events.append({"type": "RECORD_DELETED", "subject": name, "sources": []})

    def _alive(self, name: str) -> bool:
        meta = self.store.resolve(self.txn, name)
        return meta is not None and not meta.tainted and effective_state(meta, self.now) is not None

    def entry(self, whole_owner: bool, request_time: float) -> dict[str, Any]:
        return {
            "id": self.deletion_id,
            "owner": self.owner,
            "targets": self.targets,
            "rids": self.rids,
            "memory_rids": self.memory_rids,
            "tainted_rids": self.tainted_rids,
            "threads": sorted(self.done_threads),
            "record_keys": self.record_keys,
            "rings": self.rings,
            "whole_owner": whole_owner,
            "reason": self.reason,
            "deleted": len(self.rids) + len(self.memory_rids),
            "cascaded": self.cascaded,
            "tainted": self.tainted,
            "rebuilds_requested": sum(1 for e in self.events if e["type"] == "REBUILD_REQUESTED"),
            "request_time": request_time,
            "complete_time": 0.0,
            "destinations": {d: {"done": False, "time": 0.0} for d in DESTINATIONS},
        }


def _deletion_key(owner: str, deletion_id: str) -> bytes:
    return owner_prefix(owner) + deletion_id.encode()


def _delete_prefix(txn: lmdb.Transaction, db: Any, prefix: bytes) -> None:
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    while bytes(cur.key()).startswith(prefix):
        if not cur.delete():
            break


def _acquire_lock(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(
            f"{path.parent} is in use by another lethe process (one server per data directory)"
        ) from None
    return fd
