"""``conftest.py`` of the client tests when they run in the light client's own virtual environment.

``test_light_client.py`` copies it there. It makes the ``api`` fixture from
``LETHE_TEST_TARGET``, ``LETHE_TEST_ADMIN`` and ``LETHE_TEST_LIMITED`` (a token
for owner ``limited-owner``), set by the test that started the server. Imports
nothing of the server.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Api:
    target: str
    admin: str
    limited: str
    limited_owner: str
    owner: str

    @property
    def parent(self) -> str:
        return f"owners/{self.owner}"


@pytest.fixture
def api() -> Api:
    return Api(
        target=os.environ["LETHE_TEST_TARGET"],
        admin=os.environ["LETHE_TEST_ADMIN"],
        limited=os.environ["LETHE_TEST_LIMITED"],
        limited_owner="limited-owner",
        owner=f"o{secrets.token_hex(6)}",
    )
