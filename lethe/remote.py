"""The remote command line's work: erasure and proof against a running server, through the client.

``lethe forget``, ``lethe export``, ``lethe audit --target`` and ``lethe receipt
public-key --target`` are clients of the API (as ``lethe probe`` is): their
flags live in ``server/cli/``, their work here, on :class:`lethe.client.Client`
only. ``lethe receipt verify`` needs no server: :func:`verify_files` checks
receipt files offline with the store's public keys (:mod:`lethe.receipts`).

Every function takes an open client (:func:`connect`) or files, and returns a
JSON-ready document (the ``--json`` output, its schema in docs/operating.md);
the command prints it, or a human rendering of it. Failures the command
reports as exit status 2 (the server cannot be reached, refuses the token,
the owner or the request's form) are :class:`RemoteError`; a server that
answers ``NOT_FOUND`` for what was named is a failed check (exit 1), raised as
the client's :class:`lethe.client.NotFound`.

Imports the client, :mod:`lethe.receipts`, protobuf and the standard library.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from lethe.client import (
    Client,
    InvalidArgument,
    LetheError,
    PermissionDenied,
    TLSConfig,
    Unauthenticated,
    Unavailable,
)
from lethe.receipts import InvalidReceipt, read_public_keys, read_receipts, verify_receipt
from lethe.v1 import common_pb2, lifecycle_pb2

__all__ = [
    "AUDIT_FAILURES",
    "CONNECT_TIMEOUT_SECONDS",
    "EXPORT_KINDS",
    "IncompleteExport",
    "RemoteError",
    "audit",
    "connect",
    "export_line",
    "export_owner",
    "forget",
    "message_document",
    "read_export",
    "receipt_document",
    "server_info_document",
    "set_retention",
    "verify_files",
]

CONNECT_TIMEOUT_SECONDS = 10.0
"""How long a command waits for the server to answer before it gives up (exit 2)."""


class RemoteError(Exception):
    """The server cannot be reached, or refused the token, the owner or the request (exit 2)."""


class IncompleteExport(RemoteError):
    """An export stream or file that ends before its summary, or disagrees with it."""


def message_document(message: Message) -> dict[str, Any]:
    """A message as JSON-ready data: field names as in the proto, enums by name, bytes in base64.

    ``int64`` values are strings (protobuf's JSON mapping); :func:`json_format.ParseDict`
    reads the document back into the message.
    """
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def receipt_document(receipt: common_pb2.DeletionReceipt) -> dict[str, Any]:
    """``{"receipt": …}``: as ``lethe forget --json`` prints a receipt and ``verify`` reads it."""
    return {"receipt": message_document(receipt)}


@contextmanager
def connect(
    target: str, token: str, *, tls_ca: Path | None = None, timeout: float = 60.0
) -> Iterator[Client]:
    """A client of ``target`` that has answered once, closed on exit.

    Plaintext on a loopback address (as ``lethe serve`` listens by default),
    TLS anywhere else, with ``tls_ca``'s roots when given.

    Args:
        target: ``HOST:PORT`` of a serving ``lethe``.
        token: a bearer token.
        tls_ca: PEM file of the CAs that sign the server's certificate.
        timeout: deadline of each call, seconds.

    Raises:
        RemoteError: the server did not answer within :data:`CONNECT_TIMEOUT_SECONDS`,
            or the CA file cannot be read.
    """
    tls: TLSConfig | None = None
    if tls_ca is not None:
        try:
            tls = TLSConfig(root_certificates=tls_ca.read_bytes())
        except OSError as exc:
            raise RemoteError(f"--tls-ca {tls_ca}: {exc.strerror or exc}") from None
    client = Client(target, token, tls=tls, timeout=timeout)
    try:
        try:
            client.wait_ready(CONNECT_TIMEOUT_SECONDS)
        except Unavailable:
            raise RemoteError(
                f"cannot connect to {target} within {CONNECT_TIMEOUT_SECONDS:g} s (--target)"
            ) from None
        yield client
    except (Unauthenticated, PermissionDenied, Unavailable, InvalidArgument) as exc:
        raise RemoteError(_describe(target, exc)) from None
    finally:
        client.close()


def _describe(target: str, exc: LetheError) -> str:
    reason = exc.reason_name or exc.code().name
    if isinstance(exc, Unauthenticated):
        return f"{target} refused the token ({reason}; --token or LETHE_TOKEN)"
    if isinstance(exc, PermissionDenied):
        return f"{target}: the token may not act for this owner ({reason})"
    if isinstance(exc, Unavailable):
        return f"{target} is unavailable ({reason})"
    fields = "; ".join(f"{v.field}: {v.description}" for v in getattr(exc, "field_violations", ()))
    return f"{target} refused the request ({reason}{': ' + fields if fields else ''})"


# ---------------------------------------------------------------------- receipts and keys


def server_info_document(info: lifecycle_pb2.ServerInfo) -> dict[str, Any]:
    """``{store_id, keys: [{key_id, public_key, create_time, retire_time}]}``.

    ``public_key`` in base64; the times as RFC 3339 strings, ``retire_time``
    null for the current key. What ``lethe receipt public-key --json`` prints and
    :func:`lethe.receipts.read_public_keys` reads.
    """
    return {
        "store_id": info.store_id,
        "keys": [
            {
                "key_id": key.key_id,
                "public_key": base64.b64encode(key.public_key).decode("ascii"),
                "create_time": key.create_time.ToJsonString(),
                "retire_time": key.retire_time.ToJsonString()
                if key.HasField("retire_time")
                else None,
            }
            for key in info.receipt_keys
        ],
    }


def verify_files(paths: Sequence[Path], key_texts: Iterable[str]) -> dict[str, Any]:
    """Check every receipt in ``paths`` against the public keys in ``key_texts``, offline.

    Args:
        paths: receipt files (see :func:`lethe.receipts.read_receipts`).
        key_texts: each a base64 public key, or the text of a public-key file
            (``lethe receipt public-key --json``, or base64 keys one per line).

    Returns:
        ``{verified, receipts: [{file, name, store_id, key_id, valid, why}]}``;
        ``verified`` is true when there is at least one receipt and every one
        is valid. A receipt of another store than the key file names is invalid.

    Raises:
        ValueError: a key that is not 32 bytes of base64, or a file that holds
            no receipt or is not one.
        OSError: a file cannot be read.
    """
    stores: set[str] = set()
    keys: list[bytes] = []
    for text in key_texts:
        store, found = read_public_keys(text)
        if store:
            stores.add(store)
        keys.extend(found)
    if not keys:
        raise ValueError("no public key given (--public-key)")
    results: list[dict[str, Any]] = []
    for path in paths:
        receipts = read_receipts(path.read_text())
        if not receipts:
            raise ValueError(f"{path} holds no receipt")
        for receipt in receipts:
            why = ""
            try:
                verify_receipt(receipt, keys)
                if stores and receipt.store_id not in stores:
                    raise InvalidReceipt(
                        f"issued by store {receipt.store_id or '(none)'}, not by "
                        + ", ".join(sorted(stores))
                    )
            except InvalidReceipt as exc:
                why = str(exc)
            results.append(
                {
                    "file": str(path),
                    "name": receipt.name,
                    "store_id": receipt.store_id,
                    "key_id": receipt.signing_key_id,
                    "valid": not why,
                    "why": why,
                }
            )
    return {"verified": bool(results) and all(r["valid"] for r in results), "receipts": results}


# ---------------------------------------------------------------------- erasure and audit


def forget(
    client: Client,
    names: Sequence[str],
    *,
    turn_range: tuple[str, int, int] | None = None,
    delete_responses: bool = False,
    reason: str = "",
) -> common_pb2.DeletionReceipt:
    """``Lifecycle.Forget`` of ``names`` (and a range of turns); returns the signed receipt.

    Raises:
        NotFound: a named record never existed or is already gone (nothing deleted).
    """
    rng = None
    if turn_range is not None:
        thread, first, last = turn_range
        rng = {"thread": thread, "from_seq": first, "to_seq": last}
    return client.forget(
        names, range=rng, responses="DELETE" if delete_responses else None, reason=reason
    )


def set_retention(
    client: Client,
    names: Sequence[str],
    *,
    ttl: float | None = None,
    expire_time: float | None = None,
    clear: bool = False,
) -> dict[str, Any]:
    """``Lifecycle.SetRetention`` of ``names`` (records, threads, or ``owners/{o}`` alone).

    Args:
        client: a connected client.
        names: turn, memory or thread names of one owner, or the owner.
        ttl: seconds from now (an owner: from each new record's creation).
        expire_time: seconds since the epoch (not for an owner).
        clear: remove the retention instead.

    Returns:
        ``{records: [names], expire_time, owner_default_seconds}`` (times RFC
        3339 or null).

    Raises:
        NotFound: a named record never existed or is gone (nothing is changed).
    """
    done = client.set_retention(names, ttl=ttl, expire_time=expire_time, clear=clear)
    return {
        "records": [r.name for r in done.records],
        "expire_time": done.expire_time.ToJsonString() if done.HasField("expire_time") else None,
        "owner_default_seconds": done.owner_default.ToNanoseconds() / 1e9
        if done.HasField("owner_default")
        else None,
    }


AUDIT_FAILURES = (
    "orphans",
    "keys_without_record",
    "records_without_key",
    "index_drift",
    "unreadable_records",
)
"""The counts of an ``AuditReport`` that fail the audit when non-zero (``checked`` is a
size, ``stale_summaries`` a rebuild hint)."""


def audit(client: Client, owners: Sequence[str]) -> dict[str, Any]:
    """``Lifecycle.Audit`` of each owner, on the server (index drift included).

    Returns:
        ``{healthy, totals, owners}``: ``owners`` maps each unhealthy owner to its
        counts, ``totals`` sums every owner's counts; ``healthy`` is false when any
        count of :data:`AUDIT_FAILURES` is non-zero.

    An owner with nothing is audited as empty.
    """
    totals: dict[str, int] = {}
    unhealthy: dict[str, dict[str, int]] = {}
    for owner in owners:
        report = client.audit(f"owners/{owner}")
        counts = {f.name: int(getattr(report, f.name)) for f in report.DESCRIPTOR.fields}
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
        if any(counts[k] for k in AUDIT_FAILURES):
            unhealthy[owner] = counts
    return {"healthy": not unhealthy, "totals": totals, "owners": unhealthy}


# ---------------------------------------------------------------------- export

EXPORT_KINDS = ("header", "thread", "turn", "memory", "edge", "receipt", "summary")
"""The kinds of an export's lines, the ``ExportItem`` field each carries."""
_SUMMARY_COUNTS = {
    "thread": "threads",
    "turn": "turns",
    "memory": "memory_versions",
    "edge": "edges",
    "receipt": "receipts",
}


def export_line(item: lifecycle_pb2.ExportItem) -> str:
    """One line of an export file: ``{"kind": K, K: the item's message}`` (no newline).

    ``K`` is the ``ExportItem`` field set (:data:`EXPORT_KINDS`); the message is
    as :func:`message_document` writes it, so :func:`read_export` parses it back.
    """
    kind = item.WhichOneof("item")
    if kind is None:
        raise ValueError("an empty export item")
    return json.dumps({"kind": kind, kind: message_document(getattr(item, kind))}, sort_keys=True)


def _check_summary(counts: dict[str, int], summary: lifecycle_pb2.ExportSummary | None) -> None:
    if summary is None:
        raise IncompleteExport("the export ended before its summary: it is incomplete")
    for kind, field in _SUMMARY_COUNTS.items():
        if counts.get(kind, 0) != getattr(summary, field):
            raise IncompleteExport(
                f"the export holds {counts.get(kind, 0)} {kind} items, its summary "
                f"{getattr(summary, field)}"
            )


def export_owner(
    client: Client,
    owner: str,
    out: Path,
    *,
    include_sealed: bool = False,
    on_item: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``Lifecycle.ExportOwner`` of ``owner`` into ``out``, as JSON Lines (:func:`export_line`).

    The file appears only once the whole export arrived and matched its summary:
    it is written beside ``out`` under a temporary name, mode 0600 (it holds the
    owner's content in plaintext), synced, then renamed.

    Args:
        client: a connected client.
        owner: the owner id.
        out: the file to write (replaced if it exists).
        include_sealed: also sealed repair material.
        on_item: called with each item's kind as it is written (progress).

    Returns:
        ``{out, owner, store_id, bytes, threads, turns, memory_versions, edges,
        receipts}``.

    Raises:
        IncompleteExport: the stream ended before its summary or disagrees with it.
        OSError: ``out`` cannot be written.
    """
    temp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.part")
    counts: dict[str, int] = {}
    header: lifecycle_pb2.ExportHeader | None = None
    summary: lifecycle_pb2.ExportSummary | None = None
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for item in client.export_owner(f"owners/{owner}", include_sealed=include_sealed):
                kind = item.WhichOneof("item") or ""
                f.write(export_line(item) + "\n")
                counts[kind] = counts.get(kind, 0) + 1
                if kind == "header":
                    header = item.header
                elif kind == "summary":
                    summary = item.summary
                if on_item is not None:
                    on_item(kind)
            _check_summary(counts, summary)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, out)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    assert summary is not None
    return {
        "out": str(out),
        "owner": owner,
        "store_id": header.store_id if header is not None else "",
        "bytes": out.stat().st_size,
        **{field: getattr(summary, field) for field in _SUMMARY_COUNTS.values()},
    }


def read_export(path: Path) -> Iterator[lifecycle_pb2.ExportItem]:
    """The items of an export file, in order, as the server sent them.

    Raises:
        ValueError: a line that is not an export item.
        IncompleteExport: the file ends before its summary or disagrees with it
            (raised after the last item).
    """
    counts: dict[str, int] = {}
    summary: lifecycle_pb2.ExportSummary | None = None
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                kind = doc["kind"]
                item = lifecycle_pb2.ExportItem()
                json_format.ParseDict({kind: doc[kind]}, item)
            except (json.JSONDecodeError, KeyError, TypeError, json_format.ParseError) as exc:
                raise ValueError(f"{path}:{number}: not an export item ({exc})") from None
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "summary":
                summary = item.summary
            yield item
    _check_summary(counts, summary)
