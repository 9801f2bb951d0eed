"""The Connect listener (``--http-listen``): its protocol, its errors, and real clients.

What the edge tests (auth, every method, bounds, drain, limits, TLS) check on
both transports is not repeated here; here is what only HTTP has: the error
JSON and its HTTP statuses, content types and methods refused, strict JSON,
gzip, a body never read before the token is checked, the routing header — and
the clients: connect-python (the connectrpc project's Python client, JSON and
binary, gzip on) and the real ``curl`` binary (one write, one search, one
refused call).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from _connect import ConnectChannel, ConnectRpcError
from _helpers import create_thread, error_reason
from conftest import Lethe
from google.rpc import error_details_pb2

from lethe.v1 import common_pb2, events_pb2, lifecycle_pb2, retrieval_pb2, threads_pb2

SEARCH = "/lethe.v1.Retrieval/Search"


def _post(
    lethe: Lethe, path: str, body: bytes, content_type: str = "application/json", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    channel = ConnectChannel(f"127.0.0.1:{lethe.http_port}")
    return channel.post(
        path, body, content_type, [(k.replace("_", "-"), v) for k, v in headers.items()]
    )


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_errors_are_connect_json_with_the_status_details_and_http_status(lethe: Lethe) -> None:
    token = lethe.token("alice")
    body = json.dumps({"parent": "owners/bob", "queryText": "x"}).encode()
    status, headers, out = _post(lethe, SEARCH, body, **_bearer(token))
    assert (status, headers["content-type"]) == (403, "application/json")
    error = json.loads(out)
    assert error["code"] == "permission_denied"
    assert error["message"] == "token may not act for owners/bob"
    (detail,) = error["details"]
    assert detail["type"] == "google.rpc.ErrorInfo"
    info = error_details_pb2.ErrorInfo.FromString(
        base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
    )
    assert (info.reason, info.domain) == ("OWNER_NOT_ALLOWED", "lethe")
    assert detail["debug"] == {"reason": "OWNER_NOT_ALLOWED", "domain": "lethe"}
    # Each code has its HTTP status (the protocol's table); a bad field names it.
    missing = json.dumps({"name": "owners/alice/threads/nothere"}).encode()
    status, _, out = _post(lethe, "/lethe.v1.Threads/GetThread", missing, **_bearer(token))
    assert (status, json.loads(out)["code"]) == (404, "not_found")
    bad = json.dumps({"parent": "owners/alice", "queryText": "x", "topK": 5000}).encode()
    status, _, out = _post(lethe, SEARCH, bad, **_bearer(token))
    err = ConnectRpcError(status, json.loads(out))
    assert (status, error_reason(err)) == (400, (grpc.StatusCode.INVALID_ARGUMENT, "BAD_FIELD"))
    assert [d["debug"] for d in json.loads(out)["details"]][1] == {
        "fieldViolations": [{"field": "top_k", "description": "must be in 1..1000"}]
    }
    status, _, out = _post(lethe, SEARCH, body)
    assert (status, json.loads(out)["details"][0]["debug"]["reason"]) == (401, "MISSING_TOKEN")


def test_json_requests_are_parsed_strictly(lethe: Lethe) -> None:
    # proto-loader and JSON mappers that drop unknown keys make a typo a silent
    # empty query; here it is refused, saying which field.
    token = lethe.token("alice")
    typo = json.dumps({"parent": "owners/alice", "queryTxt": "puppy"}).encode()
    status, _, out = _post(lethe, SEARCH, typo, **_bearer(token))
    error = json.loads(out)
    assert (status, error["code"]) == (400, "invalid_argument")
    assert error["details"][0]["debug"]["reason"] == "MALFORMED_REQUEST"
    assert "queryTxt" in error["message"]
    status, _, out = _post(lethe, SEARCH, b'{"parent": ', **_bearer(token))
    assert (status, json.loads(out)["details"][0]["debug"]["reason"]) == (400, "MALFORMED_REQUEST")


@pytest.mark.parametrize(
    ("path", "method", "content_type", "status", "header"),
    [
        ("/lethe.v1.Threads/NoSuchMethod", "POST", "application/json", 404, None),
        ("/grpc.health.v1.Health/Check", "POST", "application/json", 404, None),
        (SEARCH, "GET", "application/json", 405, ("allow", "POST")),
        (SEARCH, "POST", "text/plain", 415, ("accept-post", "application/json, application/proto")),
        (SEARCH, "POST", "application/grpc", 415, None),
        (SEARCH, "POST", "application/connect+json", 415, None),
        ("/lethe.v1.Events/Watch", "POST", "application/json", 415, None),
    ],
)
def test_what_is_not_a_connect_call_here_is_refused_by_http_status(
    lethe: Lethe,
    path: str,
    method: str,
    content_type: str,
    status: int,
    header: tuple[str, str] | None,
) -> None:
    channel = ConnectChannel(f"127.0.0.1:{lethe.http_port}")
    conn = channel.connection()
    try:
        conn.request(method, path, b"{}", {"content-type": content_type, **_bearer("x")})
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    assert resp.status == status
    if header is not None:
        assert resp.getheader(header[0]) == header[1]


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"connect-protocol-version": "2"}, "invalid_argument"),
        ({"connect-timeout-ms": "soon"}, "invalid_argument"),
        ({"content-encoding": "br"}, "unimplemented"),
    ],
)
def test_protocol_headers_are_checked(lethe: Lethe, headers: dict[str, str], code: str) -> None:
    body = json.dumps({"parent": "owners/alice", "queryText": "x"}).encode()
    _, _, out = _post(lethe, SEARCH, body, **headers, **_bearer(lethe.token("alice")))
    assert json.loads(out)["code"] == code


def test_gzip_requests_are_inflated_within_the_receive_limit(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    srv = lethe_at(tmp_path / "d", max_receive_message_bytes=64 * 1024)
    auth = _bearer(srv.token("alice"))
    thread = create_thread(srv.client("alice"), "alice")
    append = json.dumps({"parent": thread, "turns": [{"role": "USER", "text": "zipped"}]})
    status, _, out = _post(
        srv, "/lethe.v1.Threads/AppendTurns", gzip.compress(append.encode()),
        content_encoding="gzip", **auth,
    )  # fmt: skip
    assert (status, json.loads(out)["turns"][0]["seq"]) == (200, "1")
    bomb = json.dumps({"parent": thread, "turns": [{"role": "USER", "text": "z" * 100_000}]})
    assert len(gzip.compress(bomb.encode())) < 1024  # small on the wire, too large inflated
    status, _, out = _post(
        srv, "/lethe.v1.Threads/AppendTurns", gzip.compress(bomb.encode()),
        content_encoding="gzip", **auth,
    )  # fmt: skip
    assert (status, json.loads(out)["code"]) == (429, "resource_exhausted")
    status, _, out = _post(srv, SEARCH, b"not gzip", content_encoding="gzip", **auth)
    assert json.loads(out)["details"][0]["debug"]["reason"] == "MALFORMED_REQUEST"


def _headers_only(port: int, headers: dict[str, str]) -> bytes:
    """POST headers that announce a 10 MB body, send none of it; return the answer."""
    lines = [f"POST {SEARCH} HTTP/1.1", "host: x", "content-type: application/json"]
    lines += [f"{k}: {v}" for k, v in {"content-length": "10000000", **headers}.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
            answer.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]
        ):
            chunk = s.recv(65536)
            assert chunk, answer
            answer += chunk
        return answer


def test_a_body_is_not_read_before_the_token_is_checked_nor_past_the_limit(lethe: Lethe) -> None:
    # The answer comes while the 10 MB announced are still to be sent: nothing
    # of an unauthenticated request is read, and a declared length past the
    # receive limit is refused unread.
    answer = _headers_only(lethe.http_port, {})
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"MISSING_TOKEN" in base64.b64decode(
        json.loads(answer.split(b"\r\n\r\n", 1)[1])["details"][0]["value"] + "=="
    )
    big = _headers_only(
        lethe.http_port, {**_bearer(lethe.token("alice")), "content-length": "99999999"}
    )
    assert big.startswith(b"HTTP/1.1 429"), big[:200]


def test_the_owner_header_is_checked_over_connect(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    srv = lethe_at(tmp_path / "d", require_owner_header=True)
    auth = _bearer(srv.token("alice", "bob"))
    body = json.dumps({"parent": "owners/alice"}).encode()
    path = "/lethe.v1.Threads/CreateThread"
    status, _, out = _post(srv, path, body, **auth)
    assert (status, json.loads(out)["details"][0]["debug"]["reason"]) == (
        400,
        "OWNER_HEADER_MISSING",
    )
    status, _, out = _post(srv, path, body, x_lethe_owner="bob", **auth)
    assert json.loads(out)["details"][0]["debug"]["reason"] == "OWNER_HEADER_MISMATCH"
    status, _, out = _post(srv, path, body, x_lethe_owner="alice", **auth)
    assert (status, json.loads(out)["name"].startswith("owners/alice/threads/")) == (200, True)


@pytest.mark.parametrize("proto_json", [False, True], ids=["binary", "json"])
def test_the_connectrpc_python_client_works_against_the_listener(
    lethe: Lethe, proto_json: bool
) -> None:
    """connect-python (the connectrpc project's client; it gzips requests by default)."""
    from connectrpc.client import ConnectClientSync
    from connectrpc.code import Code
    from connectrpc.errors import ConnectError
    from connectrpc.method import IdempotencyLevel, MethodInfo

    def method(service: str, name: str, request: Any, response: Any) -> Any:
        return MethodInfo(
            name=name,
            service_name=f"lethe.v1.{service}",
            input=request,
            output=response,
            idempotency_level=IdempotencyLevel.UNKNOWN,
        )

    headers = _bearer(lethe.token("alice"))
    with ConnectClientSync(f"http://127.0.0.1:{lethe.http_port}", proto_json=proto_json) as c:
        thread = c.execute_unary(
            request=threads_pb2.CreateThreadRequest(parent="owners/alice"),
            method=method(
                "Threads", "CreateThread", threads_pb2.CreateThreadRequest, threads_pb2.Thread
            ),
            headers=headers,
        )
        text = "I adopted a puppy called Biscuit " * 200  # gzipped on the way
        turns = c.execute_unary(
            request=threads_pb2.AppendTurnsRequest(
                parent=thread.name,
                turns=[threads_pb2.TurnInput(role=common_pb2.USER, text=text, commit=True)],
            ),
            method=method(
                "Threads",
                "AppendTurns",
                threads_pb2.AppendTurnsRequest,
                threads_pb2.AppendTurnsResponse,
            ),
            headers=headers,
        ).turns
        search = method(
            "Retrieval", "Search", retrieval_pb2.SearchRequest, retrieval_pb2.SearchResponse
        )
        query = retrieval_pb2.SearchRequest(parent="owners/alice", query_text="puppy")
        hits = c.execute_unary(request=query, method=search, headers=headers).hits
        assert [h.turn.name for h in hits] == [turns[0].name]
        c.execute_unary(
            request=lifecycle_pb2.ForgetRequest(names=[turns[0].name]),
            method=method(
                "Lifecycle", "Forget", lifecycle_pb2.ForgetRequest, common_pb2.DeletionReceipt
            ),
            headers=headers,
        )
        events = c.execute_server_stream(
            request=events_pb2.WatchRequest(
                parent="owners/alice", types=[events_pb2.RECORD_DELETED]
            ),
            method=method("Events", "Watch", events_pb2.WatchRequest, events_pb2.Event),
            headers=headers,
        )
        assert next(iter(events)).subject == turns[0].name
        events.close()  # type: ignore[attr-defined]  # its iterator closes the response
        assert c.execute_unary(request=query, method=search, headers=headers).hits == []
        with pytest.raises(ConnectError) as refused:
            c.execute_unary(
                request=retrieval_pb2.SearchRequest(parent="owners/bob", query_text="puppy"),
                method=search,
                headers=headers,
            )
    assert refused.value.code == Code.PERMISSION_DENIED
    (detail,) = refused.value.details
    info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(info)
    assert info.reason == "OWNER_NOT_ALLOWED"


def test_curl_writes_searches_and_reads_a_refusal(lethe: Lethe, tmp_path: Path) -> None:
    """The real ``curl`` binary: one write, one search, one refused call (CI has curl)."""
    curl = shutil.which("curl")
    if curl is None:
        if os.environ.get("CI"):
            pytest.fail("curl is missing; CI must run the curl check")
        pytest.skip("curl is not installed")
    token = lethe.token("alice")
    base = f"http://127.0.0.1:{lethe.http_port}/lethe.v1."

    def call(path: str, body: dict[str, Any], *auth: str) -> tuple[int, dict[str, Any]]:
        out = subprocess.run(
            [curl, "-sS", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
             *auth, "-d", json.dumps(body), f"{base}{path}"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        text, _, code = out.stdout.rpartition("\n")
        return int(code), json.loads(text)

    auth = ("-H", f"Authorization: Bearer {token}")
    status, thread = call(
        "Threads/CreateThread", {"parent": "owners/alice", "threadId": "t1"}, *auth
    )
    assert (status, thread["name"]) == (200, "owners/alice/threads/t1")
    turns = [{"role": "USER", "text": "I adopted a puppy", "commit": True}]
    status, appended = call(
        "Threads/AppendTurns", {"parent": thread["name"], "turns": turns}, *auth
    )
    assert (status, appended["turns"][0]["state"]) == (200, "COMMITTED")
    status, found = call(
        "Retrieval/Search", {"parent": "owners/alice", "queryText": "dog puppy"}, *auth
    )
    assert status == 200
    assert [h["turn"]["text"] for h in found["hits"]] == ["I adopted a puppy"]
    status, refused = call("Retrieval/Search", {"parent": "owners/alice", "queryText": "puppy"})
    assert (status, refused["code"]) == (401, "unauthenticated")
    assert refused["details"][0]["debug"]["reason"] == "MISSING_TOKEN"
    status, denied = call("Retrieval/Search", {"parent": "owners/bob", "queryText": "x"}, *auth)
    assert (status, denied["details"][0]["debug"]["reason"]) == (403, "OWNER_NOT_ALLOWED")


def test_cors_lets_an_allowed_origins_browser_call_and_no_other(
    lethe_at: Callable[..., Lethe], tmp_path: Path
) -> None:
    srv = lethe_at(tmp_path / "d", http_allow_origins=("https://app.example",))
    channel = ConnectChannel(f"127.0.0.1:{srv.http_port}")

    def preflight(origin: str) -> tuple[int, dict[str, str]]:
        conn = channel.connection()
        try:
            conn.request(
                "OPTIONS",
                SEARCH,
                headers={
                    "origin": origin,
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "authorization, content-type, x-lethe-owner",
                },
            )
            resp = conn.getresponse()
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    status, headers = preflight("https://app.example")
    assert status == 204
    assert headers["access-control-allow-origin"] == "https://app.example"
    assert headers["access-control-allow-methods"] == "POST"
    allowed = {h.strip() for h in headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-lethe-owner", "connect-protocol-version"} <= allowed
    status, headers = preflight("https://evil.example")
    assert status == 405
    assert "access-control-allow-origin" not in headers
    # The call itself, and its refusal, name the allowed origin (the browser reads them).
    auth = _bearer(srv.token("alice"))
    body = json.dumps({"parent": "owners/alice", "queryText": "x"}).encode()
    status, headers, _ = _post(srv, SEARCH, body, origin="https://app.example", **auth)
    assert (status, headers["access-control-allow-origin"]) == (200, "https://app.example")
    status, headers, _ = _post(srv, SEARCH, body, origin="https://app.example")
    assert (status, headers["access-control-allow-origin"]) == (401, "https://app.example")
    status, headers, _ = _post(srv, SEARCH, body, origin="https://evil.example", **auth)
    assert status == 200  # not a browser's concern here: its page cannot read it
    assert "access-control-allow-origin" not in headers
