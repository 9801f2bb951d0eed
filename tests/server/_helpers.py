"""Helpers shared by the black-box gRPC tests of the server.

Decoding ``google.rpc.Status`` details (ErrorInfo reason, BadRequest field),
creating threads, appending turns, searching and forgetting through the typed
client (:class:`lethe.client.Client`, as ``Client`` from ``tests/conftest.py``;
its errors are ``grpc.RpcError`` too), and scanning files for planted plaintext.
"""

from __future__ import annotations

import logging
import secrets
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
import lmdb
from conftest import Client
from google.protobuf import duration_pb2
from grpc_status import rpc_status

from lethe import _rpc
from lethe.v1 import common_pb2, lifecycle_pb2, memories_pb2, threads_pb2

DOMAIN = _rpc.DOMAIN


def error_reason(err: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """``(code, ErrorInfo.reason)``; reason is "" when the error carries none.

    An ``ErrorInfo`` of another domain than ``lethe`` fails the test.
    """
    info = _rpc.error_info(err)
    if info is not None:
        assert info.domain == DOMAIN, info.domain
    return err.code(), _rpc.reason_of(err)


def bad_fields(err: grpc.RpcError) -> list[str]:
    """Every ``BadRequest.field_violations[].field`` of the error.

    The error must carry a ``google.rpc.Status``.
    """
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, f"no google.rpc.Status details on {err!r}"
    return _rpc.bad_fields(err)


def bad_field(err: grpc.RpcError) -> str:
    """The single field a BAD_FIELD error names."""
    fields = bad_fields(err)
    assert len(fields) == 1, fields
    return fields[0]


def call_error(
    fn: Callable[..., Any], request: Any, md: Sequence[tuple[str, str]] | None
) -> grpc.RpcError:
    """Call an RPC that must fail; returns the ``grpc.RpcError``."""
    try:
        kwargs = {} if md is None else {"metadata": md}
        response = fn(request, **kwargs)
    except grpc.RpcError as err:
        return err
    raise AssertionError(f"expected an error, got {response!r}")


def expect_error(
    fn: Callable[..., Any],
    request: Any,
    md: Sequence[tuple[str, str]] | None,
    code: grpc.StatusCode,
    reason: str,
) -> grpc.RpcError:
    """Call an RPC, assert it fails with ``code`` and ErrorInfo ``reason``."""
    err = call_error(fn, request, md)
    assert error_reason(err) == (code, reason), (error_reason(err), err.details())
    return err


def expect_bad_field(
    fn: Callable[..., Any], request: Any, md: Sequence[tuple[str, str]] | None, field: str
) -> None:
    """Assert INVALID_ARGUMENT / BAD_FIELD naming ``field``."""
    err = expect_error(fn, request, md, grpc.StatusCode.INVALID_ARGUMENT, "BAD_FIELD")
    assert bad_field(err) == field, (bad_fields(err), err.details())


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", value)`` or ``("error", status code)`` of calling ``fn``."""
    try:
        return "ok", fn()
    except grpc.RpcError as err:
        return "error", err.code()


def unique(tag: str = "plant") -> str:
    """A unique lowercase marker word that occurs nowhere by accident."""
    return f"{tag}{secrets.token_hex(8)}"


def owner_name(owner: str) -> str:
    return f"owners/{owner}"


def create_thread(c: Client, owner: str, thread_id: str = "", title: str = "") -> str:
    """Create a thread; returns its name."""
    return str(c.create_thread(owner_name(owner), thread_id=thread_id, title=title).name)


def turn_input(
    text: str,
    *,
    commit: bool = False,
    role: common_pb2.Role.ValueType = common_pb2.USER,
    speaker: str = "",
    ttl: float | None = None,
    embedding: Iterable[float] = (),
) -> threads_pb2.TurnInput:
    inp = threads_pb2.TurnInput(
        role=role, text=text, speaker=speaker, commit=commit, embedding=list(embedding)
    )
    if ttl is not None:
        whole = int(ttl)
        inp.pending_ttl.CopyFrom(
            duration_pb2.Duration(seconds=whole, nanos=round((ttl - whole) * 1e9))
        )
    return inp


def append(
    c: Client,
    thread: str,
    texts: Sequence[str],
    *,
    commit: bool = False,
    speaker: str = "",
    ttl: float | None = None,
    request_id: str = "",
) -> list[threads_pb2.Turn]:
    """Append one turn per text; returns the stored turns (with their text echoed)."""
    resp = c.append_turns(
        thread,
        [turn_input(t, commit=commit, speaker=speaker, ttl=ttl) for t in texts],
        request_id=request_id,
        echo_text=True,
    )
    return list(resp.turns)


def search(
    c: Client,
    owner: str,
    query: str,
    *,
    thread: str = "",
    include_pending: bool = False,
    top_k: int = 50,
) -> list[threads_pb2.Turn]:
    """Search turns; returns the hit turns best first."""
    resp = c.search(
        owner_name(owner),
        query_text=query,
        top_k=top_k,
        thread=thread,
        include_pending=include_pending,
    )
    return [h.turn for h in resp.hits]


def search_texts(c: Client, owner: str, query: str, **kw: Any) -> list[str]:
    return [t.text for t in search(c, owner, query, **kw)]


def list_texts(c: Client, thread: str) -> list[str]:
    """Every listed turn text of a thread (all pages)."""
    return [t.text for t in c.iter_turns(thread)]


def get_turn(c: Client, name: str) -> threads_pb2.Turn:
    return c.get_turn(name)


def forget(
    c: Client, *names: str, rng: lifecycle_pb2.TurnRange | None = None
) -> common_pb2.DeletionReceipt:
    return c.forget(names, range=rng)


def run_cli(argv: Sequence[str]) -> int:
    """Run ``server.cli.main`` in-process, undoing its ``logging.basicConfig``."""
    from server import cli

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return cli.main(list(argv))
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)


def open_data_env(data_dir: Path) -> lmdb.Environment:
    """Open the (stopped) server's data environment with raw ``lmdb``."""
    return lmdb.open(str(data_dir / "data"), max_dbs=32, map_size=64 << 30)


def rid_of(env: lmdb.Environment, owner: str, thread_id: str, seq: int) -> bytes:
    """The 8-byte record-number key of a turn, from the ``seqs`` database."""
    seqs = env.open_db(b"seqs")
    with env.begin() as txn:
        rk = txn.get(f"{owner}\x00{thread_id}\x00".encode() + struct.pack(">Q", seq), db=seqs)
    assert rk is not None, (owner, thread_id, seq)
    return bytes(rk)


def files_containing(root: Path, needles: Iterable[str]) -> list[tuple[str, str]]:
    """(file, needle) for every regular file under ``root`` holding a needle.

    A needle counts in UTF-8 or UTF-16 (LE/BE) encoding.
    """
    patterns = []
    for needle in needles:
        for enc in ("utf-8", "utf-16-le", "utf-16-be"):
            patterns.append((needle, needle.encode(enc)))
    hits = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        for needle, raw in patterns:
            if raw in data:
                hits.append((str(path), needle))
    return hits


def ref(name: str, version: int = 1) -> common_pb2.SourceRef:
    """A SourceRef of ``name`` at ``version``."""
    return common_pb2.SourceRef(name=name, version=version)


def reply(c: Client, thread: str, text: str, refs: Sequence[str]) -> threads_pb2.Turn:
    """Append a committed assistant turn whose ``context_refs`` name ``refs`` (version 1)."""
    turn = {
        "role": "ASSISTANT",
        "text": text,
        "commit": True,
        "context_refs": [ref(n) for n in refs],
    }
    return c.append_turns(thread, [turn]).turns[0]


def summary(
    c: Client, mid: str, text: str, sources: Sequence[str], commit: bool = True
) -> memories_pb2.Memory:
    """Create a SUMMARY of alice's with ``sources`` (version 1 each)."""
    memory = {
        "kind": "SUMMARY",
        "text": text,
        "sources": [ref(n) for n in sources],
        "state": "COMMITTED" if commit else "PENDING",
    }
    return c.create_memory("owners/alice", memory, memory_id=mid)


def visible_anywhere(c: Client, thread: str, needle: str) -> bool:
    """Whether ``needle`` appears in alice's search results in any mode or in ``thread``'s context.

    That is the context assembled for ``thread``.
    """
    found = ""
    for mode in ("HYBRID", "DENSE", "LEXICAL"):
        found += str(c.search("owners/alice", query_text=needle, top_k=50, mode=mode))
    found += str(c.assemble_context(thread, query_text=needle))
    return needle in found


def search_names(c: Client, query: str, **kw: Any) -> list[str]:
    """Names of the turns alice's Search returns for ``query`` (top 10)."""
    resp = c.search("owners/alice", query_text=query, top_k=10, **kw)
    return [h.turn.name for h in resp.hits]


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``predicate`` every 5 ms until it holds; AssertionError past ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.005)
