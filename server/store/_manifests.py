"""Context manifests (API.md, ``Retrieval.GetContextManifest``), ids only.

A manifest is the (name, version) refs one context assembly returned, stored by
id so that an assistant turn naming the manifest has those records as its
lineage.

Thread rules: as every part of :class:`server.store.Store`.
"""

from __future__ import annotations

import lmdb

from lethe.names import new_id
from server.errors import NotFound
from server.store import _schema as sk
from server.store._base import StoreBase
from server.store._records import ManifestRow
from server.store._writer import WriteOp


class ManifestsPart(StoreBase):
    """Manifest operations of :class:`server.store.Store`."""

    def put_manifest(self, owner: str, thread: str, refs: list[tuple[str, int]], now: float) -> str:
        """Store a manifest of ``refs`` made for ``thread`` at ``now`` (seconds).

        Returns:
            The manifest's name, ``owners/{owner}/manifests/{id}``.
        """
        manifest_id = new_id()
        row = ManifestRow(list(refs), now, thread)

        def apply(txn: lmdb.Transaction) -> None:
            txn.put(sk.manifest_key(owner, manifest_id), row.encode(), db=self.t.manifests)

        self.writer.run(WriteOp(apply, owner=owner, name="manifest"))
        return f"owners/{owner}/manifests/{manifest_id}"

    def get_manifest(self, owner: str, manifest_id: str) -> ManifestRow:
        """A stored manifest.

        Raises:
            NotFound: no such manifest.
        """
        with self.env.begin() as txn:
            raw = sk.get(txn, self.t.manifests, sk.manifest_key(owner, manifest_id))
        if raw is None:
            raise NotFound(f"owners/{owner}/manifests/{manifest_id} not found")
        return ManifestRow.decode(raw)
