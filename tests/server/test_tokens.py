"""The token lifecycle against a running server: create, list, revoke, expire; digests only.

``lethe token create`` with a label and an expiry, ``list`` (ids, never
secrets), ``revoke``; revocation and expiry take effect within a second without
a restart, open streams included; tokens are stored as digests only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from _helpers import create_thread, error_reason, expect_error, open_data_env
from conftest import Client, Lethe

from lethe.v1 import events_pb2, threads_pb2
from server import token_digest

UNAUTH = grpc.StatusCode.UNAUTHENTICATED
LETHE = (sys.executable, "-m", "server.cli")


def _cli(data: Path, kek: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LETHE_KEK": kek}
    return subprocess.run(
        [sys.executable, "-m", "server.cli", "token", *args, "--data", str(data)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _list(data: Path, kek: str) -> dict[str, list[str]]:
    """``lethe token list`` as {id: [state, created, expires, label, acts for]}."""
    out = _cli(data, kek, "list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "state", "created", "expires"]
    rows = {}
    for line in lines[1:]:
        fields = line.split()
        rows[fields[0]] = fields[1:]
    return rows


def _stubs(lethe: Lethe, token: str) -> Client:
    return lethe.client(token=token, retry=None)


def _list_threads(c: Client) -> list[str]:
    resp = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/alice"), metadata=c.md, timeout=10
    )
    return [t.name for t in resp.threads]


def _until_refused(c: Client, limit: float) -> float:
    """Seconds until alice's listing is refused (calls every 20 ms, up to ``limit``)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        try:
            _list_threads(c)
        except grpc.RpcError as err:
            refused_after = time.monotonic() - start
            reason = error_reason(err)
            break
        time.sleep(0.02)
    else:
        raise AssertionError(f"still accepted after {limit} s")
    assert reason == (UNAUTH, "INVALID_TOKEN")
    return refused_after


def test_create_list_and_revoke_on_a_running_server(lethe: Lethe, kek_env: str) -> None:
    created = _cli(lethe.data_dir, kek_env, "create", "--owner", "alice", "--label", "laptop-1")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("lethe_")
    assert "\n" not in token
    token_id = token_digest(token)[:8].hex()
    assert f"token {token_id} created" in created.stderr
    c = _stubs(lethe, token)
    thread = create_thread(c, "alice")  # a new token works at once, no restart
    assert _list_threads(c) == [thread]

    rows = _list(lethe.data_dir, kek_env)
    assert rows[token_id][0] == "active"
    assert rows[token_id][3:] == ["laptop-1", "alice"]
    listing = _cli(lethe.data_dir, kek_env, "list").stdout
    assert token not in listing
    assert token[6:20] not in listing
    assert token_digest(token).hex() not in listing  # only the 8-byte prefix

    stream = c.events.Watch(
        events_pb2.WatchRequest(parent="owners/alice"), metadata=c.md, timeout=30
    )
    revoked = _cli(lethe.data_dir, kek_env, "revoke", token_id)
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.startswith(f"revoked {token_id} at ")
    assert _until_refused(c, limit=1.0) < 1.0
    # The open stream ends too, within a second of the revocation.
    with pytest.raises(grpc.RpcError) as ended:
        for _ in stream:
            pass
    assert error_reason(ended.value) == (UNAUTH, "INVALID_TOKEN")
    assert _list(lethe.data_dir, kek_env)[token_id][0] == "revoked"
    # Revoking again is idempotent; an unknown id is an error.
    assert _cli(lethe.data_dir, kek_env, "revoke", token_id).returncode == 0
    unknown = _cli(lethe.data_dir, kek_env, "revoke", "0123456789abcdef")
    assert unknown.returncode == 1
    assert "no token has id" in unknown.stderr


def test_an_expiring_token_works_until_it_expires(lethe: Lethe, kek_env: str) -> None:
    before = time.time()  # the CLI stamps the expiry after this
    created = _cli(lethe.data_dir, kek_env, "create", "--owner", "alice", "--expires-in", "3s")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    c = _stubs(lethe, token)
    create_thread(c, "alice")
    stream = c.events.Watch(
        events_pb2.WatchRequest(parent="owners/alice"), metadata=c.md, timeout=30
    )
    waited = _until_refused(c, limit=10.0)
    assert time.time() - before >= 3.0  # never refused before it expired
    assert waited < 10.0
    with pytest.raises(grpc.RpcError) as ended:
        for _ in stream:
            pass
    assert error_reason(ended.value) == (UNAUTH, "INVALID_TOKEN")
    token_id = token_digest(token)[:8].hex()
    assert _list(lethe.data_dir, kek_env)[token_id][0] == "expired"


def test_revoked_and_unknown_tokens_are_refused_alike(lethe: Lethe) -> None:
    assert lethe.server is not None
    c = lethe.client("alice")
    token_id = token_digest(c.token)[:8].hex()
    assert lethe.server.store.revoke_token(token_id) is not None
    req = threads_pb2.ListThreadsRequest(parent="owners/alice")
    revoked = expect_error(c.threads.ListThreads, req, c.md, UNAUTH, "INVALID_TOKEN")
    unknown = expect_error(
        c.threads.ListThreads,
        req,
        (("authorization", "Bearer lethe_" + "x" * 43),),
        UNAUTH,
        "INVALID_TOKEN",
    )
    assert revoked.details() == unknown.details()  # no oracle of which tokens exist


@pytest.mark.parametrize(
    "args",
    [
        ["create", "--owner", "alice", "--label", "has space"],
        ["create", "--owner", "alice", "--expires-in", "soon"],
        ["create", "--owner", "alice", "--expires-in", "0s"],
    ],
)
def test_token_create_refuses_bad_flags(lethe: Lethe, kek_env: str, args: list[str]) -> None:
    out = _cli(lethe.data_dir, kek_env, *args)
    assert out.returncode == 2
    assert out.stdout == ""


def test_tokens_are_stored_as_digests_only(
    lethe_at: Callable[..., Lethe], tmp_path: Path, kek_env: str
) -> None:
    srv = lethe_at(tmp_path / "d")
    token = _cli(srv.data_dir, kek_env, "create", "--admin", "--label", "ops").stdout.strip()
    srv.stop()
    env = open_data_env(srv.data_dir)
    try:
        with env.begin() as txn:
            db = env.open_db(b"tokens", txn=txn)
            rows = list(txn.cursor(db=db))
    finally:
        env.close()
    assert [bytes(k) for k, _ in rows] == [token_digest(token)]
    raw = b"".join(bytes(k) + bytes(v) for k, v in rows)
    assert token.encode() not in raw
    assert token[6:].encode() not in raw


def _token_of(created: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    return token, token_digest(token)[:8].hex()


def test_a_restore_neither_revives_a_revoked_token_nor_loses_a_new_one(
    lethe: Lethe, kek_env: str, tmp_path: Path
) -> None:
    """Tokens live in the keystore's ledger, which a restore never rolls back.

    A token revoked after the backup stays revoked, one created after it stays
    valid, and ``lethe restore`` says which; both once came back as the backup
    had them (the revoked one working again, the new one refused).
    """
    old, old_id = _token_of(_cli(lethe.data_dir, kek_env, "create", "--owner", "alice"))
    c = _stubs(lethe, old)
    thread = create_thread(c, "alice")
    backup = tmp_path / "backup"
    env = {**os.environ, "LETHE_KEK": kek_env}
    done = subprocess.run(
        [*LETHE, "backup", "--data", str(lethe.data_dir), "--out", str(backup)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert _cli(lethe.data_dir, kek_env, "revoke", old_id).returncode == 0
    new, new_id = _token_of(_cli(lethe.data_dir, kek_env, "create", "--owner", "alice"))
    lethe.stop()
    restored = subprocess.run(
        [*LETHE, "restore", "--data", str(lethe.data_dir), "--backup", str(backup), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert restored.returncode == 0, restored.stderr
    lethe.start()
    expect_error(
        _stubs(lethe, old).threads.ListThreads,
        threads_pb2.ListThreadsRequest(parent="owners/alice"),
        (("authorization", f"Bearer {old}"),),
        UNAUTH,
        "INVALID_TOKEN",
    )
    assert _list_threads(_stubs(lethe, new)) == [thread]
    rows = _list(lethe.data_dir, kek_env)
    assert (rows[old_id][0], rows[new_id][0]) == ("revoked", "active")
    report = json.loads(restored.stdout)["tokens"]
    assert report["revoked"] == [old_id]
    assert report["restored"] == [new_id]
    assert report["removed"] == []
