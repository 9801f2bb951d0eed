"""An index snapshot's write killed at each step, on the real server process: the store converges.

The sweeper (200 ms sweeps: an owner settles after 2 s) writes the snapshot of
the owner a search loaded; the server dies of SIGKILL at the armed point: the
snapshot key made (``snapshot.key.after_keystore``, ``.after_commit``), the
snapshot sealed and synced in its temporary file (``snapshot.after_temp``), or
renamed into place (``snapshot.after_rename``). The next start removes what
the kill left half done (a temporary file, a key without a snapshot), a
snapshot in place is whole and loads, searches answer, and the audit is clean.

Then a forget killed between its key destruction and the snapshot's removal:
the snapshot left behind does not open, and start-up removes it.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from _harness import OWNER, armed, audit, base_env, make_token, serving

from lethe._rpc import Stubs
from lethe.v1 import common_pb2, lifecycle_pb2, retrieval_pb2, threads_pb2

PARENT = f"owners/{OWNER}"
TEXTS = ["alpha harbour", "beta violin", "gamma orchard", "delta glacier"]
SWEEPING = ("--sweep-interval", "200ms")


def _fill(s: Stubs) -> list[str]:
    thread = s.threads.CreateThread(
        threads_pb2.CreateThreadRequest(parent=PARENT, thread_id="t1"), metadata=s.md
    ).name
    resp = s.threads.AppendTurns(
        threads_pb2.AppendTurnsRequest(
            parent=thread,
            turns=[threads_pb2.TurnInput(role=common_pb2.USER, text=t, commit=True) for t in TEXTS],
        ),
        metadata=s.md,
    )
    return [t.name for t in resp.turns]


def _search(s: Stubs, text: str) -> list[str]:
    resp = s.retrieval.Search(
        retrieval_pb2.SearchRequest(
            parent=PARENT, query_text=text, top_k=20, mode=retrieval_pb2.SearchRequest.LEXICAL
        ),
        metadata=s.md,
    )
    return [h.turn.text for h in resp.hits]


def _audit_rpc(s: Stubs) -> tuple[int, ...]:
    r = s.lifecycle.Audit(lifecycle_pb2.AuditRequest(parent=PARENT), metadata=s.md)
    return (r.orphans, r.keys_without_record, r.records_without_key, r.index_drift)


def _strays(data: Path, env: dict[str, str]) -> int:
    """Stray snapshot files and keys, counted on the store offline."""
    import os

    from server.store import Store

    saved = os.environ.get("LETHE_KEK")
    os.environ["LETHE_KEK"] = env["LETHE_KEK"]
    try:
        store = Store(data, lock=False)
        try:
            return store.snapshot_strays()
        finally:
            store.close()
    finally:
        if saved is None:
            os.environ.pop("LETHE_KEK", None)
        else:
            os.environ["LETHE_KEK"] = saved


POINTS = [
    "snapshot.key.after_keystore",
    "snapshot.key.after_commit",
    "snapshot.after_temp",
    "snapshot.after_rename",
]


@pytest.mark.parametrize("point", POINTS)
def test_a_snapshot_write_killed_at_each_step_converges(
    point: str, tmp_path: Path, kek_env: str
) -> None:
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        _fill(clean.stubs(token))
    with serving(data, armed(env, point), *SWEEPING) as doomed:
        assert _search(doomed.stubs(token), "violin")[0] == "beta violin"  # loads the owner
        assert doomed.killed(), f"{point} was not reached"
    snapshot = data / "index" / f"{OWNER}.snapshot"
    assert snapshot.exists() == (point == "snapshot.after_rename")
    left = {"snapshot.after_temp": 2, "snapshot.after_rename": 0}.get(point, 1)
    assert _strays(data, env) == left  # the key without a snapshot, the temporary file
    with serving(data, env) as again:
        s = again.stubs(token)
        assert _search(s, "violin")[0] == "beta violin"
        assert _search(s, "orchard")[0] == "gamma orchard"
        assert _audit_rpc(s) == (0, 0, 0, 0)
        assert not snapshot.with_name(f"{OWNER}.snapshot.tmp").exists()
    loaded = "from its snapshot" in again.stderr()
    assert loaded == (point == "snapshot.after_rename")  # whole when in place: it loads
    assert _strays(data, env) == 0
    assert audit(data, env)[0] == 0


def test_a_forget_killed_before_the_snapshot_is_removed_leaves_nothing_to_open(
    tmp_path: Path, kek_env: str
) -> None:
    """``forget.finish.after_commit``: keys destroyed, rows purged, the snapshot not removed."""
    data = tmp_path / "d"
    env = base_env(kek_env)
    token = make_token(data, env, OWNER)
    with serving(data, env) as clean:
        names = _fill(clean.stubs(token))
        _search(clean.stubs(token), "harbour")  # loaded: the stop writes its snapshot
    snapshot = data / "index" / f"{OWNER}.snapshot"
    assert snapshot.exists()
    with serving(data, armed(env, "forget.finish.after_commit")) as doomed:
        s = doomed.stubs(token)
        with pytest.raises(grpc.RpcError):
            s.lifecycle.Forget(lifecycle_pb2.ForgetRequest(names=[names[0]]), metadata=s.md)
        assert doomed.killed()
    assert snapshot.exists()  # left behind: its key is gone
    assert _strays(data, env) == 1
    with serving(data, env) as again:
        s = again.stubs(token)
        assert "alpha harbour" not in _search(s, "harbour")
        assert _search(s, "glacier")[0] == "delta glacier"
        assert _audit_rpc(s) == (0, 0, 0, 0)
    assert "from its snapshot" not in again.stderr()
    assert audit(data, env)[0] == 0
