"""A real store (real LMDB and keystore) holding ``alice``'s thread ``t1`` of committed turns.

For the white-box store tests.
"""

from __future__ import annotations

from pathlib import Path

from server.store import Store, TurnDraft


def one_thread_store(path: Path, n: int) -> Store:
    """A store at ``path`` with turns 1..n in ``alice``/``t1``, committed, no vectors.

    Texts are ``turn {i}``; the append's request id is ``req-1``. Close it
    after use.
    """
    s = Store(path)
    s.create_thread("alice", "t1", "")
    drafts = [TurnDraft(1, "", f"turn {i}", None, None, "", [], True, 0.0) for i in range(1, n + 1)]
    s.append_turns("alice", "t1", drafts, "req-1")
    return s
