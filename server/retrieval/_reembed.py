"""Re-embedding an owner's records when the server's embedder changed.

At start, :func:`check_embedder` compares the embedder the server runs with the
one the store recorded (:meth:`server.store.Store.record_embedder`: name and
dimension) and logs the change. On the first use of an owner whose vectors
another embedder made (search, context assembly, append, a memory write),
:func:`reembed_owner` decrypts the text of every live record of the owner —
turns in any state, memories at their current version — embeds it with the new
model in batches of :data:`BATCH`, logging a progress line per batch, and hands
all the vectors to :meth:`server.store.Store.replace_vectors`, which swaps them
and the owner's embedder in ONE write transaction. A kill at any moment leaves
the owner wholly on the old model (re-embedded again on the next first use) or
wholly on the new one (failpoint ``reembed.batch`` is reached after each batch,
for the crash tests in ``tests/crash/test_reembed_crash.py``).

No old vector survives the swap: a record whose text cannot be decrypted loses
its vector (it is unreadable anyway; counted by ``note_unreadable``), and a
memory that got a new version meanwhile (a transition carries the old vector
along) makes the swap write nothing; it is embedded again and the swap retried.

A vector a client sent is replaced as well: after the change, every vector of
the owner is the new model's. With ``--embedder none`` nothing is re-embedded:
the owner's stored vectors stay, and clients must send vectors of the owner's
dimension (they should be of the same model).

Cost: the first use of each owner after a change waits for the whole re-embed
(about the time of embedding its texts); later uses do not.

Thread rules: the caller holds the owner's index lock (see
:meth:`server.retrieval.Retriever.ensure_vectors`), so no write of the owner's
vectors runs between the snapshot of its records and the swap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from index import Embedder
from server.errors import Aborted, DataLoss, RecordDeleted
from server.store import (
    NO_EMBEDDER,
    EmbedderChange,
    MemMeta,
    MemoryView,
    Store,
    TurnMeta,
    TurnView,
)
from shredder import declare, failpoint

_log = logging.getLogger(__name__)

BATCH = 256
"""Texts embedded per batch (and per progress line)."""
ATTEMPTS = 8
"""Swaps tried before giving up when memories keep getting new versions."""
Vector = npt.NDArray[np.float32] | None
FP_REEMBED_BATCH = declare(
    "reembed.batch",
    "a batch of an owner's records was re-embedded; nothing of the owner is replaced yet",
)


def check_embedder(store: Store, embedder: Embedder | None) -> EmbedderChange | None:
    """Record the embedder the server starts with and log a change (module docstring).

    Returns:
        The change, or None when the store already recorded this embedder.
    """
    name, dim = (embedder.name, embedder.dim) if embedder is not None else (NO_EMBEDDER, 0)
    change = store.record_embedder(name, dim)
    if change is None or not change.previous:
        if change is not None and change.owners:
            _log.warning(
                "no embedder was recorded: %d owner(s) whose dimension differs from %s's "
                "(%d) will be re-embedded on first use",
                change.owners,
                name,
                dim,
            )
        return change
    if embedder is None:
        _log.warning(
            "embedder changed from %s (%d dimensions) to none: stored vectors are kept; "
            "clients must send vectors of each owner's dimension",
            change.previous,
            change.previous_dim,
        )
    else:
        _log.warning(
            "embedder changed from %s (%d dimensions) to %s (%d): the vectors of %d owner(s) "
            "will be re-embedded on each owner's first use",
            change.previous,
            change.previous_dim,
            name,
            dim,
            change.owners,
        )
    return change


TextOf = Callable[[TurnView | MemoryView], str]


def _embed_batch(
    store: Store, embedder: Embedder, rids: list[int], text_of: TextOf
) -> tuple[dict[int, Vector], dict[int, tuple[int, Vector]]]:
    """Decrypt and embed the records ``rids``, turns and memories apart.

    Returns (turns rid -> vector, memories rid -> (version, vector)).

    A record that cannot be read gets None (its old vector is removed, never
    kept); a forgotten one is left out.
    """
    texts: dict[int, str] = {}
    versions: dict[int, int] = {}
    unreadable: list[TurnMeta | MemMeta] = []
    with store.key_batch():  # one keystore snapshot, each record key unwrapped once
        for rid, (meta, cts) in store.fetch(rids).items():
            if isinstance(meta, MemMeta):
                versions[rid] = meta.version
            try:
                texts[rid] = text_of(store.view_of(meta, cts))
            except RecordDeleted:  # forgotten meanwhile (or its key is gone)
                versions.pop(rid, None)
            except DataLoss:  # unreadable: no vector can be made; counted and logged
                store.note_unreadable(meta)
                unreadable.append(meta)
    ids = list(texts)
    rows = embedder.embed([texts[r] for r in ids])
    made: dict[int, Vector] = {m.rid: None for m in unreadable}
    for rid, row in zip(ids, rows, strict=True):
        made[rid] = np.ascontiguousarray(row) if float(np.dot(row, row)) > 0.0 else None
    turns = {rid: vec for rid, vec in made.items() if rid not in versions}
    memories = {rid: (versions[rid], vec) for rid, vec in made.items() if rid in versions}
    return turns, memories


def reembed_owner(store: Store, embedder: Embedder, owner: str, text_of: TextOf) -> int:
    """Re-embed every live record of ``owner`` with ``embedder`` (module docstring).

    Texts are embedded in batches of :data:`BATCH`, one progress line logged per
    batch; then every vector and the owner's embedder are swapped in one write
    transaction. A memory that got a new version meanwhile (a transition, carrying
    the old model's vector) is embedded again and the swap retried, so the swap
    is never partial.

    Args:
        store: The record store.
        embedder: The server's embedder.
        owner: The owner.
        text_of: What a record is embedded as (``server.retrieval._indexed_text.indexed_text``:
            ``speaker: text`` for a turn, as AppendTurns embeds it; a memory's
            text, or its edge ``subject predicate object``).

    Returns:
        The number of records whose vector was replaced or removed.

    Raises:
        Aborted: the owner's memories kept changing version through
            :data:`ATTEMPTS` swaps (nothing was replaced; the next use retries).
        StoreFull, Unavailable: the swap could not be written (nothing was replaced).
    """
    started = time.monotonic()
    previous = store.owner_embedder(owner)
    rids = [m.rid for m in store.owner_turns(owner) if not m.deleted]
    rids += [m.rid for m in store.owner_memories(owner) if not m.deleted]
    _log.info(
        "re-embedding owner %s: %d records, %s -> %s (%d dimensions)",
        owner,
        len(rids),
        previous,
        embedder.name,
        embedder.dim,
    )
    turns: dict[int, Vector] = {}
    memories: dict[int, tuple[int, Vector]] = {}
    for start in range(0, len(rids), BATCH):
        got_turns, got_memories = _embed_batch(
            store, embedder, rids[start : start + BATCH], text_of
        )
        turns.update(got_turns)
        memories.update(got_memories)
        done = min(start + BATCH, len(rids))
        _log.info("re-embedding owner %s: %d/%d records", owner, done, len(rids))
        failpoint(FP_REEMBED_BATCH)
    for _ in range(ATTEMPTS):
        swap = store.replace_vectors(owner, embedder.name, embedder.dim, turns, memories)
        if not swap.stale:
            break
        _log.info("re-embedding owner %s: %d memories changed meanwhile", owner, len(swap.stale))
        for rid in swap.stale:
            memories.pop(rid, None)
        memories.update(_embed_batch(store, embedder, swap.stale, text_of)[1])
    else:
        raise Aborted(f"the memories of owner {owner} kept changing during the re-embed; retry")
    _log.info(
        "re-embedded owner %s: %d records in %.1f s; its vectors are all %s's",
        owner,
        swap.replaced,
        time.monotonic() - started,
        embedder.name,
    )
    return swap.replaced
