"""Opaque page tokens (AIP-158) for the List methods.

A page token says where the next page starts (the last id or seq of the
page just returned) and is bound to the request it continues: a token is
accepted only by the method that issued it, for a request whose fields are
all the same but ``page_size`` (which AIP-158 lets a client change between
pages) and ``page_token``. It is authenticated with HMAC-SHA256 under a key
of this server process, so a client can neither forge one nor reuse one
elsewhere: anything else answers ``INVALID_ARGUMENT`` / ``BAD_FIELD`` naming
``page_token``.

Token layout (URL-safe base64 without padding of)::

    offset  size  field
    0       1     format version, 0x01
    1       n     cursor: where the next page starts, UTF-8 (an id or a seq)
    1+n     16    tag: HMAC-SHA256(key, encoded fields), first 16 bytes

    encoded fields = for each of ("lethe-page-token/1", the request message's
    full name, the request serialised deterministically without page_size and
    page_token, the page-size policy "100/1000", the cursor): a 4-byte
    big-endian length, then the bytes.

The key is 32 random bytes drawn when the servicer is made, held in memory
only and never written anywhere. Why not a key in the keystore (which would
let tokens survive a restart): a page token only says where a listing the
caller may read anyway goes on, so the key protects the contract (tokens are
opaque, clients cannot build or edit them) rather than any data; a key that
is never on disk cannot leak through a data backup, a keystore snapshot or a
copied data directory, needs no rotation and no crash-atomic write; and a
server restart or a restored backup, after which old positions may no longer
mean the same, simply invalidates every token. AIP-158 allows tokens to
expire: a client that gets ``BAD_FIELD`` on ``page_token`` lists again from
the first page. The cursor is not encrypted: it is the last id on the page
the client already holds (ids are not secret, API.md), and the format
version lets the server change it.

Thread rules: a :class:`PageTokens` is immutable and safe from any thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import struct
from typing import NoReturn

from google.protobuf.message import Message

from server.errors import InvalidArgument

_FORMAT = 0x01
_DOMAIN = b"lethe-page-token/1"
_TAG_SIZE = 16
_MAX_TOKEN_CHARS = 1024
_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]+")
_UNBOUND_FIELDS = ("page_token", "page_size")


class PageTokens:
    """Issues and checks the page tokens of one server process.

    Layout and key policy are in the module docstring.

    Args:
        policy: the page-size policy bound into every token (default size and
            cap, e.g. ``"100/1000"``): tokens issued under another policy are
            refused.

    Refuses pickling and copying; repr never shows the key.
    """

    __slots__ = ("_key", "_policy")

    def __init__(self, policy: str) -> None:
        self._key = secrets.token_bytes(32)
        self._policy = policy.encode()

    def issue(self, request: Message, cursor: str) -> str:
        """The ``next_page_token`` that resumes ``request`` at ``cursor``.

        Args:
            request: the List request this page answered.
            cursor: where the next page starts (the last id or seq returned);
                "" means there is no next page.

        Returns:
            The token, or "" when ``cursor`` is "".
        """
        if not cursor:
            return ""
        raw = cursor.encode()
        tag = self._tag(request, raw)
        return base64.urlsafe_b64encode(bytes([_FORMAT]) + raw + tag).decode().rstrip("=")

    def resume(self, request: Message) -> str:
        """The cursor of ``request.page_token``, "" for the first page.

        Raises:
            InvalidArgument: ``page_token`` (reason ``BAD_FIELD``) was not issued
                by this server process for this method and these request fields,
                or was altered.
        """
        token = str(getattr(request, "page_token", ""))
        if not token:
            return ""
        if len(token) > _MAX_TOKEN_CHARS or not _TOKEN_RE.fullmatch(token):
            _refuse()
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            _refuse()
        if len(raw) < 1 + _TAG_SIZE or raw[0] != _FORMAT:
            _refuse()
        cursor, tag = raw[1:-_TAG_SIZE], raw[-_TAG_SIZE:]
        if not hmac.compare_digest(tag, self._tag(request, cursor)):
            _refuse()
        try:
            return cursor.decode()
        except UnicodeDecodeError:  # unreachable without the key; refuse anyway
            _refuse()

    def _tag(self, request: Message, cursor: bytes) -> bytes:
        bound = type(request)()
        bound.CopyFrom(request)
        for name in _UNBOUND_FIELDS:
            if name in bound.DESCRIPTOR.fields_by_name:
                bound.ClearField(name)
        fields = (
            _DOMAIN,
            bound.DESCRIPTOR.full_name.encode(),
            bound.SerializeToString(deterministic=True),
            self._policy,
            cursor,
        )
        data = b"".join(struct.pack(">I", len(f)) + f for f in fields)
        return hmac.new(self._key, data, hashlib.sha256).digest()[:_TAG_SIZE]

    def __repr__(self) -> str:
        return "<PageTokens>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("PageTokens cannot be pickled")

    def __copy__(self) -> NoReturn:
        raise TypeError("PageTokens cannot be copied")

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise TypeError("PageTokens cannot be copied")


def _refuse() -> NoReturn:
    raise InvalidArgument(
        "page_token",
        "not a token this server issued for this listing and these request fields "
        "(tokens do not survive a server restart: list again from the first page)",
    )
