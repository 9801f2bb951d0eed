"""What an owner's export reads besides the listings: every version of a memory, lineage edges.

``Lifecycle.ExportOwner`` walks an owner page by page with the store's own
listings (threads, turns, memories, deletions: the same visibility rules as
every read) and asks this part for the two things no listing gives: every
stored version of a memory (a correction keeps the old one, readable by
explicit version) and the lineage edges of the records it exported.

Thread rules: read methods, safe from any thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from server.errors import DataLoss, RecordDeleted
from server.store._base import StoreBase
from server.store._lineage import ancestors_of
from server.store._records import SEALED
from server.store._views import MemoryView
from server.store._visibility import effective_state

Edge = tuple[tuple[str, int], tuple[str, int]]
"""``((source name, source version), (derivative name, derivative version))``."""


class ExportPart(StoreBase):
    """Reads of an owner's export (see the module docstring)."""

    def memory_versions(
        self, owner: str, memory_id: str, *, include_sealed: bool = False
    ) -> list[MemoryView]:
        """Every stored version of a live memory, oldest first.

        Older versions carry no lineage (it is kept for the current version
        only); an unreadable version is skipped and counted as unreadable.

        Args:
            owner: the owner.
            memory_id: the memory's id.
            include_sealed: also a sealed memory's versions.

        Returns:
            The versions, or ``[]`` when the memory is gone, expired, or sealed
            and ``include_sealed`` is false.
        """
        now = time.time()
        with self.env.begin() as txn:
            found = self._mem_by_id(txn, owner, memory_id)
            if found is None:
                return []
            meta = self._memory_read(txn, found, now)
            state = effective_state(meta, now)
            if state is None or (state == SEALED and not include_sealed):
                return []
            rows = [(v, self._memory_ct(txn, meta, v)) for v in sorted(map(int, meta.key_ids))]
        out: list[MemoryView] = []
        for version, ct in rows:
            try:
                view = self.memory_view(meta, version, ct)
            except RecordDeleted:
                continue
            except DataLoss:
                self.note_unreadable(meta)
                continue
            if version != meta.version:
                view.sources = []
            out.append(view)
        return out

    def lineage_edges(self, derivatives: Sequence[str]) -> list[Edge]:
        """The lineage edges whose derivative is one of ``derivatives`` (one read transaction).

        Each edge names its source at the version the derivative references;
        a source may since be gone (a tainted response keeps its edges).
        """
        with self.env.begin() as txn:
            return [
                ((source, sv), (name, dv))
                for name in derivatives
                for source, (sv, dv) in ancestors_of(txn, self.t, name)
            ]
