"""The nginx config ``lethe shard nginx-config`` writes, as text.

The ring, the placements, never re-routing, the error answers, TLS and limits.
(Real nginx runs it in ``tests/test_shards.py``.)
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from google.rpc import error_details_pb2, status_pb2

from server.cli import main
from server.cli._nginx import NginxPlan, Shard, nginx_config, parse_placement, parse_shards


def _shards() -> list[Shard]:
    return [
        *parse_shards("a=10.0.0.1:50051,b=10.0.0.2:50051"),
        *parse_shards("d=10.0.0.4:50051", ring=False),
    ]


def test_ring_placements_and_no_rerouting() -> None:
    text = nginx_config(NginxPlan(_shards(), {"alice": "d", "bob": "a"}, listen="0.0.0.0:443"))
    ring = text.split("upstream lethe_ring {", 1)[1].split("}", 1)[0]
    assert "hash $http_x_lethe_owner consistent;" in ring
    assert "10.0.0.1:50051 max_fails=0" in ring
    assert "10.0.0.2:50051 max_fails=0" in ring
    assert "10.0.0.4" not in ring  # outside the ring: only placed owners go there
    placements = text.split("map $http_x_lethe_owner $lethe_upstream {", 1)[1].split("}", 1)[0]
    assert '"alice" lethe_shard_d;' in placements
    assert '"bob" lethe_shard_a;' in placements
    assert "default lethe_ring;" in placements
    assert "grpc_next_upstream off;" in text
    assert "listen 0.0.0.0:443 http2;" in text
    assert f"client_max_body_size {16 * 1024 * 1024 + 5};" in text
    assert "grpc_pass grpc://$lethe_upstream;" in text


def _details(text: str, key: str) -> status_pb2.Status:
    line = next(line for line in text.splitlines() if line.strip().startswith(f'"{key}"'))
    value = line.split()[1].strip('";')
    status = status_pb2.Status.FromString(base64.b64decode(value + "=" * (-len(value) % 4)))
    return status


def test_an_unreachable_shard_answers_shard_unavailable_naming_it() -> None:
    text = nginx_config(NginxPlan(_shards()))
    status = _details(text, "10.0.0.2:50051")
    assert status.code == 14
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert (info.reason, info.domain) == ("SHARD_UNAVAILABLE", "lethe")
    assert dict(info.metadata) == {"shard": "b", "target": "10.0.0.2:50051"}


def test_tls_both_sides() -> None:
    plan = NginxPlan(
        _shards(),
        tls_cert=Path("/etc/lethe/proxy.pem"),
        tls_key=Path("/etc/lethe/proxy.key"),
        upstream_ca=Path("/etc/lethe/ca.pem"),
        upstream_server_name="lethe.internal",
        upstream_cert=Path("/etc/lethe/client.pem"),
        upstream_key=Path("/etc/lethe/client.key"),
        max_message_bytes=1 << 20,
    )
    text = nginx_config(plan)
    assert "listen 127.0.0.1:8443 ssl http2;" in text
    assert "grpc_pass grpcs://$lethe_upstream;" in text
    assert "grpc://" not in text
    assert "grpc_ssl_verify on;" in text
    assert "grpc_ssl_name lethe.internal;" in text
    assert "grpc_ssl_certificate /etc/lethe/client.pem;" in text
    assert f"client_max_body_size {(1 << 20) + 5};" in text


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (NginxPlan(parse_shards("a=h:1", ring=False)), "hash ring"),
        (NginxPlan(parse_shards("a=h:1"), {"alice": "z"}), "no shard is named z"),
        (NginxPlan(parse_shards("a=h:1"), tls_cert=Path("c")), "go together"),
        (NginxPlan(parse_shards("a=h:1"), upstream_ca=Path("c")), "upstream-server-name"),
    ],
)
def test_inconsistent_plans_are_refused(plan: NginxPlan, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nginx_config(plan)


@pytest.mark.parametrize("text", ["a", "A=h:1", "a=h", "a=h:0", "a=h:1,a=g:2", "a=h:1;x"])
def test_malformed_shard_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="shard"):
        parse_shards(text)


def test_placements_parse() -> None:
    assert parse_placement("alice=b") == ("alice", "b")
    with pytest.raises(ValueError, match="OWNER=SHARD"):
        parse_placement("Alice=b")


def test_the_command_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lethe.conf"
    args = ["shard", "nginx-config", "--shards", "a=127.0.0.1:1,b=127.0.0.1:2", "--out", str(out)]
    assert main([*args, "--placement", "alice=b"]) == 0
    assert '"alice" lethe_shard_b;' in out.read_text()
    assert main([*args, "--placement", "alice=q"]) == 2
    assert "no shard is named q" in capsys.readouterr().err


def test_the_shard_audit_fails_on_a_non_zero_count(capsys: pytest.CaptureFixture[str]) -> None:
    """Two shards' /metrics, one with orphans: the totals add up and the shard audit exits 1.

    Real Prometheus endpoints of the server's registry: one healthy, one with
    orphans.
    """
    from prometheus_client import start_http_server

    from server._metrics import Metrics
    from server.cli._shard import _print_audit, shard_audit

    healthy, sick = Metrics(), Metrics()
    sick.orphan_derivatives.set(2)
    servers = []
    addresses = []
    for metrics in (healthy, sick):
        server, _ = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
        servers.append(server)
        addresses.append(f"127.0.0.1:{server.server_port}")
    try:
        shards = parse_shards(f"a={addresses[0]},b={addresses[1]}")
        found = shard_audit(shards)
        assert found["a"]["lethe_orphan_derivatives"] == 0
        assert found["b"]["lethe_orphan_derivatives"] == 2
        assert _print_audit(found) == 1
        assert "all: orphan_derivatives=2" in capsys.readouterr().out
        assert _print_audit({"a": found["a"]}) == 0
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def _http_plan(**kwargs: object) -> NginxPlan:
    return NginxPlan(
        _shards(),
        {"alice": "d"},
        http_listen="0.0.0.0:8080",
        http_shards={"a": "10.0.0.1:8080", "b": "10.0.0.2:8080", "d": "10.0.0.4:8080"},
        http_route_socket=Path("/run/lethe/route.sock"),
        **kwargs,  # type: ignore[arg-type]
    )


def test_connect_calls_are_routed_by_the_grpc_ring_to_each_shards_http_listener() -> None:
    text = nginx_config(_http_plan())
    http = text.split("listen 0.0.0.0:8080;", 1)[1]
    # The HTTP listener asks the route server, which asks the gRPC ring and placements...
    assert "auth_request /_lethe_shard;" in http
    assert "proxy_method POST;" in http
    route = text.split("listen unix:/run/lethe/route.sock;", 1)[1].split("\n}\n", 1)[0]
    assert "grpc_pass grpc://$lethe_upstream;" in route
    assert "grpc_set_header TE trailers;" in route
    # ...then goes to the HTTP listener of the shard at the gRPC address picked.
    picked = text.split("map $lethe_shard_address $lethe_http_upstream {", 1)[1].split("}", 1)[0]
    assert '"10.0.0.1:50051" lethe_shard_a_http;' in picked
    assert '"10.0.0.4:50051" lethe_shard_d_http;' in picked
    assert "server 10.0.0.4:8080 max_fails=0;" in text
    assert "proxy_buffering off;" in http
    assert "proxy_next_upstream off;" in http
    assert f"client_max_body_size {16 * 1024 * 1024 + 64 * 1024 + 5};" in http
    # No ring of HTTP addresses: it would place owners elsewhere than gRPC's ring.
    assert text.count("consistent;") == 1


def test_connect_refusals_from_nginx_are_connect_error_json() -> None:
    text = nginx_config(_http_plan())
    line = next(x for x in text.splitlines() if x.strip().startswith('"10.0.0.2:8080"'))
    error = json.loads(line.split(None, 1)[1].rstrip(";").strip("'"))
    assert error["code"] == "unavailable"
    detail = error["details"][0]
    assert detail["type"] == "google.rpc.ErrorInfo"
    info = error_details_pb2.ErrorInfo.FromString(
        base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
    )
    assert (info.reason, dict(info.metadata)) == (
        "SHARD_UNAVAILABLE",
        {"shard": "b", "target": "10.0.0.2:50051"},
    )
    assert "OWNER_HEADER_MISSING" in text.split("location @lethe_http_no_owner {", 1)[1]


def test_connect_over_tls_both_sides() -> None:
    text = nginx_config(
        _http_plan(
            tls_cert=Path("/etc/lethe/proxy.pem"),
            tls_key=Path("/etc/lethe/proxy.key"),
            upstream_ca=Path("/etc/lethe/ca.pem"),
            upstream_server_name="lethe.internal",
            upstream_cert=Path("/etc/lethe/client.pem"),
            upstream_key=Path("/etc/lethe/client.key"),
        )
    )
    assert "listen 0.0.0.0:8080 ssl http2;" in text
    assert "proxy_pass https://$lethe_http_upstream;" in text
    assert "proxy_ssl_verify on;" in text
    assert "proxy_ssl_certificate /etc/lethe/client.pem;" in text
    route = text.split("listen unix:/run/lethe/route.sock;", 1)[1]
    assert "grpc_pass grpcs://$lethe_upstream;" in route


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"http_listen": "0.0.0.0:8080"}, "go together"),
        ({"http_shards": {"a": "10.0.0.1:8080"}}, "go together"),
        (
            {"http_listen": "0.0.0.0:8080", "http_shards": {"a": "10.0.0.1:8080"}},
            "every shard",
        ),
    ],
)
def test_an_http_plan_that_misses_a_shard_is_refused(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        nginx_config(NginxPlan(_shards(), **kwargs))  # type: ignore[arg-type]
