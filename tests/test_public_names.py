"""Pins the public names of the ``server`` package (STYLE.md: private modules,
explicit public names). ``shredder`` and ``index`` pin theirs in their own tests."""

from __future__ import annotations

import server


def test_server_public_names_are_pinned() -> None:
    assert sorted(server.__all__) == [
        "LetheError",
        "LetheServer",
        "ServerConfig",
        "Store",
        "StoreLockedError",
        "new_token",
        "principal_record",
        "token_digest",
    ]


def test_server_public_names_resolve() -> None:
    for name in server.__all__:
        assert getattr(server, name).__module__.startswith("server"), name
