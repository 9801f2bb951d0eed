"""The echo sweep of a forget, and the end of its guard: forgetting beyond declared lineage.

Declared lineage (a memory's ``sources``, a reply's manifest) tells a forget
what was built from the forgotten records. An *echo* is what repeats one of
them without saying so: an assistant turn that said the fact again, a summary
rebuilt from history that held it. A forget with an echo action (``REPORT``,
``TAINT`` — the default — or ``FORGET``; ``IGNORE`` looks for none) does, before
its step 1:

1. read the texts it is about to forget (:meth:`server.store.Store.forget_texts`;
   their keys still exist: they go in step 3);
2. look for them in the owner's live records
   (:func:`server.retrieval.find_owner_echoes`: word shingles and containment,
   :data:`server.retrieval.ECHO_RULE`): the owner's committed index, and the
   pending turns among the :data:`PENDING_WINDOW` latest of each thread it
   touches;
3. make sure the key of the guard's bucket exists
   (:meth:`server.store.Store.ensure_guard_key`: once per owner and bucket) and
   hand what it found, and the guard to set, to the plan
   (:class:`server.store.EchoSweep`), whose one transaction acts on the echoes
   that are not the forget's declared descendants and writes the guard's rows
   beside the tombstones.

Nothing but a bucket's key (and its row) is written before step 1's
transaction, so a crash during the sweep leaves nothing to converge
(:data:`FP_SWEEP_READ`), and one between the key and the plan a key whose
bucket ends as any other; once step 1 committed, the
sweep's results are part of the plan and a resumed entry never sweeps again (it
could not: the texts' keys may be gone).

The guard stands for its window (``ForgetRequest.echo_guard``, default
``--echo-guard-window``, itself the pending TTL by default: a pending record
written before the forget expires within it, or reaches general retrieval
through a commit the guard checks), rounded up to its bucket's end. The sweeper
ends the buckets that passed (:func:`expire_guards`): key destroyed, then rows
deleted (:meth:`server.store.Store.expire_guard_key`); start-up does it too, so
a crash between the two converges.

Thread rules: any thread (each step waits on the store's writer).
"""

from __future__ import annotations

import secrets
import time

from server.retrieval import (
    DEFAULT_RECENT,
    ECHO_RULE,
    Retriever,
    echo_terms,
    find_owner_echoes,
)
from server.store import (
    ECHO_FORGET,
    ECHO_TAINT,
    EchoSweep,
    ForgetTargets,
    GuardPlan,
    Store,
    TurnMeta,
    guard_end,
)
from shredder import declare, failpoint

PENDING_WINDOW = 2 * DEFAULT_RECENT
"""The latest turns of each thread the forget touches in which the sweep looks for pending
echoes: twice the recent turns context assembly serves by default (pending turns are in no
index the sweep reads, and a thread serves them as its immediate context)."""

FP_SWEEP_READ = declare(
    "echo.sweep.after_read",
    "a forget's echo sweep read the texts it forgets and looked for them; nothing written",
)


def sweep_echoes(
    store: Store,
    retriever: Retriever,
    owner: str,
    targets: ForgetTargets,
    action: str,
    guard_window: float,
) -> EchoSweep:
    """Look for the echoes of what ``targets`` forget (see the module docstring).

    Args:
        store: the record store.
        retriever: the owner's indexes (the sweep's candidates).
        owner: whose records.
        targets: what the forget names (never a whole owner).
        action: ``REPORT``, ``TAINT`` or ``FORGET``.
        guard_window: seconds the guard stands (0: none; ``REPORT`` sets none).

    Returns:
        What the plan acts on: the records found, the texts looked for, the guard.
    """
    read = store.forget_texts(owner, targets)
    sources = [echo_terms(text) for _, text in read]
    sets = [ECHO_RULE.shingles(terms) for terms in sources]
    live = [i for i, shingles in enumerate(sets) if ECHO_RULE.sweepable(shingles)]
    found: dict[int, list[int]] = {}
    if live:
        whole = set(targets.threads)
        threads = {m.thread for m, _ in read if isinstance(m, TurnMeta) and m.thread not in whole}
        pending = store.recent_pending(owner, sorted(threads), PENDING_WINDOW)
        exclude = {m.rid for m, _ in read}
        found = find_owner_echoes(
            retriever,
            owner,
            [sources[i] for i in live],
            [(m.rid, text) for m, text in pending],
            exclude,
        )
    failpoint(FP_SWEEP_READ)
    guard = None
    if live and action in (ECHO_TAINT, ECHO_FORGET) and guard_window > 0:
        end, key_id = guard_end(time.time(), guard_window)
        store.ensure_guard_key(owner, key_id, end)
        guard = GuardPlan(
            guard_id=secrets.token_hex(8),
            expire_time=end,
            key_id=key_id,
            action=action,
            shingles=tuple(tuple(s.encode() for s in sorted(sets[i])) for i in live),
            need=tuple(ECHO_RULE.needed(len(sets[i])) for i in live),
        )
    return EchoSweep(action, tuple(sorted(found)), len(live), guard)


def expire_guards(store: Store, now: float) -> int:
    """End every guard bucket that passed: its key destroyed (shred log), then its rows.

    Returns:
        How many guards ended.
    """
    ended = 0
    for row in store.echo_keys():
        if row.expire_time <= now:
            ended += store.expire_guard_key(row)
    return ended
