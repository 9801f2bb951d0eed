"""Start-up recovery: bring the store to a consistent state after a crash or a restore.

Runs once, at start-up (and after ``lethe restore``), before any call is
served and while the indexes are empty (:func:`recover`). Start-up never
forgets what nobody decided to forget.

Thread rules: the main thread, before serving.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from server.errors import StoreFull, Unavailable
from server.lifecycle._deletions import REASON_KEY_DESTROYED, Deletions
from server.store import (
    ForgetTargets,
    KeyCheck,
    MemMeta,
    SnapshotCleanup,
    TokenReconcile,
    record_ring,
)
from shredder import RingRef

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(slots=True)
class Recovery:
    """What :func:`recover` did at start-up.

    Attributes:
        kek_versions_retired: KEK versions a cut-short rotation left behind.
        keys_relocated: keys moved back to the ring their records name.
        deletions_resumed: outstanding deletion-log entries finished.
        forgotten: records forgotten because their keys were destroyed on
            purpose after they were written (reason ``KEY_DESTROYED``).
        kept_without_key: names of live records whose key is missing with no
            decided deletion: kept, unreadable (``DATA_LOSS``), reported.
        stray_keys_destroyed: keys no record uses.
        stray_snapshots_removed: stray index-snapshot files removed and
            snapshot keys destroyed (:meth:`server.store.Store.clean_snapshots`).
        tokens: what bringing the data's copy of the tokens in line with the
            keystore's ledger changed (tokens revoked or created after a
            restored backup); None when the step was deferred.
        echo_guards_ended: echo guards whose window passed (one a crash cut
            short between destroying its key and deleting its rows included).
        deferred: steps that could not write (full disk or store) and wait for
            the next start.
    """

    kek_versions_retired: list[int]
    keys_relocated: int
    deletions_resumed: int
    forgotten: int
    kept_without_key: list[str]
    stray_keys_destroyed: int
    tokens: TokenReconcile | None = None
    deferred: list[str] = field(default_factory=list)
    echo_guards_ended: int = 0
    stray_snapshots_removed: int = 0

    def changed(self) -> bool:
        """Whether recovery changed anything or deferred a step (start-up logs it then)."""
        return bool(
            self.kek_versions_retired
            or self.keys_relocated
            or self.deletions_resumed
            or self.forgotten
            or self.kept_without_key
            or self.stray_keys_destroyed
            or self.stray_snapshots_removed
            or (self.tokens is not None and self.tokens != TokenReconcile())
            or self.deferred
            or self.echo_guards_ended
        )

    def summary(self) -> str:
        """One log line (ids and counts only)."""
        return (
            f"{self.deletions_resumed} deletions resumed, {self.forgotten} records whose keys "
            f"were shredded forgotten, {len(self.kept_without_key)} records without a key kept, "
            f"{self.keys_relocated} keys relocated, {self.stray_keys_destroyed} stray keys "
            f"destroyed, {self.stray_snapshots_removed} stray index snapshots removed, "
            f"KEK versions {self.kek_versions_retired} retired"
            + (f"; {self.tokens.summary()}" if self.tokens is not None else "")
            + (f"; {self.echo_guards_ended} echo guards ended" if self.echo_guards_ended else "")
            + (f"; deferred: {', '.join(self.deferred)}" if self.deferred else "")
        )


def recover(deletions: Deletions) -> Recovery:
    """Bring the store to a consistent state after a crash or a restore, at start-up.

    No call is being served then, and the indexes are empty.

    In order: finish a rotation cut short (destroy KEK versions that wrap
    nothing); move keys an interrupted seal left in another ring back to
    the ring their records name (the data decided whether the seal
    happened); resume every outstanding deletion; forget the records whose
    keys were destroyed on purpose since the data was written (the shred
    log names them: a restored backup); keep and report loudly every live
    record whose key is missing with no decided deletion; destroy keys no
    record uses (made for writes that never committed; an echo guard's key
    whose rows never committed among them); bring the data's copy of the
    tokens in line with the keystore's ledger (a revocation or a token newer
    than a restored backup); end the echo guards whose window passed; remove
    stray index snapshots (temporary files, snapshots whose key a deletion
    destroyed, keys without a snapshot). Start-up never forgets what nobody
    decided to forget.

    A step that cannot write (a full disk, ``--max-store-size`` reached) is
    deferred to the next start, logged at error level: the store still
    opens and serves reads, and nothing it defers makes a forgotten record
    readable (tombstones and destroyed keys already hold).
    """
    deferred: list[str] = []

    def attempt(step: str, run: Callable[[], _T], otherwise: Callable[[], _T]) -> _T:
        try:
            return run()
        except (Unavailable, StoreFull) as exc:
            _log.error("recovery: %s deferred to the next start: %s", step, exc.message)
            deferred.append(step)
            return otherwise()  # only then: it may cost a pass over the store

    retired = deletions.store.retire_unused_kek_versions()
    # One pass over the data and the keystore answers the next three steps
    # unless a step changed something, which makes it stale.
    check = deletions.store.check_keys()
    relocated = attempt(
        "key relocation", lambda: deletions.store.relocate_keys(check.misplaced), lambda: 0
    )
    resumed = attempt("resuming deletions", deletions.resume_outstanding, lambda: 0)
    if relocated or resumed:
        check = deletions.store.check_keys()
    forgotten = attempt(
        "forgetting shredded threads", lambda: _forget_decided_threads(deletions, check), lambda: 0
    )
    if forgotten:
        check = deletions.store.check_keys()
    more, kept = attempt(
        "forgetting shredded records",
        lambda: _forget_decided_records(deletions, check),
        lambda: (0, [r.name for r in deletions.store.records_without_key()]),
    )
    if more:  # forgetting destroyed keys: the check's key listing is stale
        check = deletions.store.check_keys()
    stray = attempt(
        "destroying stray keys", lambda: deletions.store.destroy_unreferenced_keys(check), lambda: 0
    )
    for name in kept:
        _log.error(
            "%s has no key and no decided deletion: kept unreadable for an operator "
            "(lethe audit; forget it to remove it)",
            name,
        )
    deletions.metrics.records_without_key.set(len(kept))
    tokens = attempt("reconciling tokens", deletions.store.reconcile_tokens, lambda: None)
    guards = attempt("ending echo guards", deletions.expire_guards, lambda: 0)
    snapshots = attempt(
        "removing stray index snapshots", deletions.store.clean_snapshots, SnapshotCleanup
    )
    return Recovery(
        retired,
        relocated,
        resumed,
        forgotten + more,
        kept,
        stray,
        tokens,
        deferred,
        guards,
        snapshots.files + snapshots.keys,
    )


def _forget_decided_threads(deletions: Deletions, check: KeyCheck) -> int:
    count = 0
    for meta in deletions.store.threads_without_key(check):
        ring = RingRef(meta.owner, meta.thread)
        if deletions.store.shred_decided(meta, ring, meta.title_key):
            entry = deletions.forget(
                meta.owner, ForgetTargets.of(threads=[meta.thread]), reason=REASON_KEY_DESTROYED
            )
            count += entry.deleted
    return count


def _forget_decided_records(deletions: Deletions, check: KeyCheck) -> tuple[int, list[str]]:
    by_owner: dict[str, list[tuple[str, int]]] = defaultdict(list)
    mems_by_owner: dict[str, list[str]] = defaultdict(list)
    kept: list[str] = []
    for record in deletions.store.records_without_key(check):
        if not deletions.store.shred_decided(record, record_ring(record), record.key_id):
            kept.append(record.name)
        elif isinstance(record, MemMeta):
            mems_by_owner[record.owner].append(record.memory_id)
        else:
            by_owner[record.owner].append((record.thread, record.seq))
    count = 0
    for owner in {*by_owner, *mems_by_owner}:
        targets = ForgetTargets.of(turns=by_owner[owner], memories=mems_by_owner[owner])
        entry = deletions.forget(owner, targets, reason=REASON_KEY_DESTROYED)
        count += entry.deleted
    return count, kept
