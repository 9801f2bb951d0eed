"""Signed deletion receipts: the bytes a store signs, and checking a receipt offline.

Every :class:`~lethe.v1.common_pb2.DeletionReceipt` a server returns is signed
with an Ed25519 key of its store (``DeletionReceipt.signature``, by the key
``signing_key_id``); ``Lifecycle.GetServerInfo`` and ``lethe receipt
public-key`` publish the public keys, retired ones included. What is signed
(:func:`signed_bytes`)::

    b"lethe-receipt/1" | 0x00 | the receipt with `signature` cleared, serialized
                                deterministically (fields in number order)

so every field but the signature is covered — the store, the targets, the
counts, the destinations, the times and the shred horizon — and a receipt
never holds content. A key's id is the first 8 bytes of the SHA-256 of its
32-byte public key, in hex (:func:`key_id`).

:func:`verify_receipt` needs PyNaCl (the server distribution has it; with the
light client, install ``lethe-store-client[verify]``), imported only when
called. :func:`read_receipts` and :func:`read_public_keys` read the files a
data-protection officer is handed: receipts as JSON (a receipt, a document
with a ``receipt`` member such as ``lethe forget --json`` prints, a list of
either, or JSON Lines such as ``lethe export`` writes), and public keys as
``lethe receipt public-key --json`` prints them or as base64.

Imports protobuf, the standard library and ``lethe.v1``; PyNaCl only inside
:func:`verify_receipt` (signing is the store's: :func:`sign_receipt` is given its signer).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from google.protobuf import json_format

from lethe.v1 import common_pb2

__all__ = [
    "RECEIPT_DOMAIN",
    "InvalidReceipt",
    "key_id",
    "read_public_keys",
    "read_receipts",
    "sign_receipt",
    "signed_bytes",
    "verify_receipt",
]

RECEIPT_DOMAIN = b"lethe-receipt/1\x00"
"""The prefix of every signed receipt: a signature made for anything else never verifies here."""
_KEY_BYTES = 32


class InvalidReceipt(ValueError):
    """A receipt that does not verify: unsigned, signed by an unknown key, or altered."""


def key_id(public_key: bytes) -> str:
    """The id of an Ed25519 public key: the first 8 bytes of its SHA-256, 16 hex characters."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def signed_bytes(receipt: common_pb2.DeletionReceipt) -> bytes:
    """What the store signs for ``receipt``: the domain, then the receipt without its signature."""
    unsigned = common_pb2.DeletionReceipt()
    unsigned.CopyFrom(receipt)
    unsigned.ClearField("signature")
    return RECEIPT_DOMAIN + unsigned.SerializeToString(deterministic=True)


def sign_receipt(
    receipt: common_pb2.DeletionReceipt,
    store_id: str,
    sign: Callable[[Callable[[str], bytes]], tuple[str, bytes]],
) -> None:
    """Name the store on ``receipt`` and sign it, in place.

    Args:
        receipt: the receipt (its ``signing_key_id`` and ``signature`` are replaced).
        store_id: the issuing store's id.
        sign: the store's signer: given a function from the current key's id to
            the bytes to sign, returns ``(key id, signature)``.
    """
    receipt.store_id = store_id

    def message(key: str) -> bytes:
        receipt.signing_key_id = key
        return signed_bytes(receipt)

    receipt.signing_key_id, receipt.signature = sign(message)


def verify_receipt(receipt: common_pb2.DeletionReceipt, public_keys: Iterable[bytes]) -> str:
    """Check ``receipt``'s signature against the store's public keys.

    Args:
        receipt: the receipt as issued (binary, or parsed from JSON with this
            module's schema).
        public_keys: 32-byte Ed25519 public keys of the store (any number; the
            one the receipt names is picked by its id).

    Returns:
        The id of the key that signed it.

    Raises:
        InvalidReceipt: it carries no signature, names a key not among
            ``public_keys``, or its signature does not match its fields.
        ImportError: PyNaCl is not installed.
    """
    import nacl.exceptions
    import nacl.signing

    if not receipt.signature or not receipt.signing_key_id:
        raise InvalidReceipt(f"{receipt.name or 'the receipt'} carries no signature")
    by_id = {key_id(k): k for k in public_keys}
    public = by_id.get(receipt.signing_key_id)
    if public is None:
        raise InvalidReceipt(
            f"{receipt.name or 'the receipt'} is signed by key {receipt.signing_key_id}, "
            "which is not among the public keys given"
        )
    try:
        nacl.signing.VerifyKey(public).verify(signed_bytes(receipt), receipt.signature)
    except (nacl.exceptions.BadSignatureError, ValueError):
        raise InvalidReceipt(
            f"{receipt.name or 'the receipt'}: the signature does not match its fields "
            "(altered, or not issued by this store)"
        ) from None
    return receipt.signing_key_id


def _receipt_documents(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, list):
        for item in value:
            yield from _receipt_documents(item)
    elif isinstance(value, dict):
        inner = value.get("receipt")
        yield inner if isinstance(inner, dict) else value
    else:
        raise ValueError("expected a JSON object (a receipt) or a list of them")


def read_receipts(text: str) -> list[common_pb2.DeletionReceipt]:
    """The receipts in a file's text (see the module docstring for the shapes taken).

    Raises:
        ValueError: not JSON or JSON Lines, or a document that is not a receipt.
    """
    try:
        documents: list[Any] = [json.loads(text)]
    except json.JSONDecodeError:
        try:
            documents = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise ValueError(f"neither JSON nor JSON Lines: {exc}") from None
    out = []
    for doc in documents:
        if isinstance(doc, dict) and "kind" in doc and doc.get("kind") != "receipt":
            continue  # another line of an export
        for item in _receipt_documents(doc):
            receipt = common_pb2.DeletionReceipt()
            try:
                json_format.ParseDict(item, receipt)
            except json_format.ParseError as exc:
                raise ValueError(f"not a deletion receipt: {exc}") from None
            out.append(receipt)
    return out


def _decode_key(text: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"not a base64 public key: {text.strip()[:20]!r}") from None
    if len(raw) != _KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {_KEY_BYTES} bytes, got {len(raw)}")
    return raw


def read_public_keys(text: str) -> tuple[str, list[bytes]]:
    """The store id (or "") and the public keys in ``text``.

    ``text`` is what ``lethe receipt public-key --json`` prints (``{store_id,
    keys: [{key_id, public_key}]}``, ``public_key`` in base64) or base64 keys,
    one per line.

    Raises:
        ValueError: a key that is not 32 bytes of base64, or a key whose id
            differs from the one listed beside it.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return "", [_decode_key(line) for line in text.splitlines() if line.strip()]
    keys = []
    for item in doc.get("keys", []):
        raw = _decode_key(str(item.get("public_key", "")))
        if item.get("key_id") and item["key_id"] != key_id(raw):
            raise ValueError(f"key {item['key_id']} is listed beside another key's bytes")
        keys.append(raw)
    return str(doc.get("store_id", "")), keys
