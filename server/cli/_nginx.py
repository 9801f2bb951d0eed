"""The nginx config that routes each owner to its shard (``lethe shard nginx-config``).

A pure module: text in, text out, no I/O.

Lethe scales out by owner (ARCHITECTURE.md, "Scale beyond one machine"):
several ``lethe serve`` instances, each with its own data directory, keystore
and KEK, behind nginx (Debian's package: ``grpc_pass``, ``hash … consistent``,
``map``), which routes every call on its ``x-lethe-owner`` header
(:data:`lethe.names.OWNER_HEADER`, sent by the typed clients) to the one
server that holds the owner. Lethe has no proxy of its own.

:func:`nginx_config` writes the ``http {}``-level part of that config
(Debian: ``/etc/nginx/conf.d/lethe.conf``):

- **ring**: an upstream ``lethe_ring`` over the ring shards, ``hash
  $http_x_lethe_owner consistent`` (ketama: adding or removing a ring shard
  moves about 1/n of the owners);
- **placements**: a ``map`` from owner to a shard of its own, for owners
  placed elsewhere than the ring puts them (``--placement owner=shard``). A
  shard outside the ring (``--placed-shards``) receives only the owners
  placed on it, so adding a shard that way moves exactly the owners you
  choose;
- **never elsewhere**: ``max_fails=0`` and ``grpc_next_upstream off``, so
  nginx never marks a shard down and never retries a call on another shard
  (the hash would otherwise fall through to the next shard of the ring, and
  an owner's writes would land where it does not live). A shard that cannot be
  reached answers ``UNAVAILABLE`` / ``SHARD_UNAVAILABLE`` with its address in
  the ``ErrorInfo`` metadata (``target``, ``shard``), from nginx itself,
  after ``grpc_connect_timeout``; other owners are unaffected;
- **health**: Debian's nginx has passive checks only (``health_check`` is
  nginx Plus), and passive checks would re-route (above). Instead
  ``grpc.health.v1.Health/Check`` is routed like any call — on
  ``x-lethe-owner`` to that owner's shard — or, with ``x-lethe-shard:
  {name}``, to the named shard, so a monitor probes each shard through the
  proxy (``grpc_health_probe -rpc-header x-lethe-shard:b``);
- **a call without the header** to ``/lethe.v1.*`` is refused by nginx with
  ``INVALID_ARGUMENT`` / ``OWNER_HEADER_MISSING`` (it has no owner to route
  on); run the shards with ``--require-owner-header`` to refuse it there too;
- HTTP/2 to the shards (``grpc_pass``, kept-alive connections), TLS to them
  where they serve it (``grpcs://``, ``--upstream-ca``, optionally a client
  certificate), TLS on nginx's own listener (``--tls-cert``/``--tls-key``);
- limits matching the servers': ``client_max_body_size`` is the servers'
  receive limit plus gRPC's 5-byte message prefix (one unary request is one
  message), and the read/send timeouts are long enough for ``Watch`` streams;
- **the Connect listener** (``--http-listen`` with each shard's own
  ``--http-shards NAME=HOST:PORT``): an HTTP server block that proxies Connect
  calls to the shards' HTTP listeners, on the same ``x-lethe-owner`` header
  and to the **same shard** as gRPC. nginx's ``hash … consistent`` places a
  key by the addresses it hashes, and a shard's HTTP address differs from its
  gRPC one, so a ring of HTTP addresses would place owners elsewhere. Instead
  each Connect call first asks the gRPC ring (and the placements) which shard
  holds its owner: an ``auth_request`` subrequest, POSTed to a route server
  of nginx's own (on a Unix socket, ``--http-route-socket``: a subrequest is
  a GET, which gRPC servers reset), which ``grpc_pass``-es a call to no
  method that the shard answers at once (``UNIMPLEMENTED``, nothing read) and
  answers with the address the ring picked; the call then goes to that
  shard's HTTP listener. The cost is one HTTP/2 round trip to the shard per
  call (and a local one to the route server). Refusals are Connect error
  JSON (``OWNER_HEADER_MISSING``, ``SHARD_UNAVAILABLE``); HTTP/1.1 on a
  plaintext listener, HTTP/2 and HTTP/1.1 (ALPN) with ``--tls-cert``;
  responses are not buffered, so ``Watch`` events arrive as they happen.

The shard side of a placement (moved-away markers, token import, the audit
of every shard) is ``lethe shard`` (:mod:`server.cli._shard`).

Thread rules: none (pure functions).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from lethe.names import ID_RE, OWNER_HEADER
from server.errors import DOMAIN, Reason

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "NginxPlan",
    "Shard",
    "nginx_config",
    "parse_placement",
    "parse_shards",
]

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The servers' default receive limit, bytes (``lethe serve --max-receive-message-size``)."""
GRPC_PREFIX_BYTES = 5
"""Bytes gRPC puts before each message on the wire (1 flag byte, 4 length bytes)."""
CONNECT_BODY_SLACK = 64 * 1024 + 5
"""Bytes a Connect request body may exceed the message limit by: a stream's
5-byte envelope prefix, and gzip's overhead (``server.edge._connect``'s
``GZIP_SLACK``, 64 KiB)."""
SHARD_HEADER = "x-lethe-shard"
"""Metadata that sends a health check to a named shard instead of an owner's."""
_ADDRESS_RE = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})")


@dataclass(frozen=True, slots=True)
class Shard:
    """One ``lethe serve`` instance.

    Attributes:
        name: its name (an id: ``[a-z0-9][a-z0-9-]{0,62}``), used in placements,
            markers and the config's upstream names.
        address: its gRPC ``HOST:PORT``.
        ring: whether it is a member of the consistent-hash ring (False: it
            serves only owners placed on it).
    """

    name: str
    address: str
    ring: bool = True

    @property
    def upstream(self) -> str:
        """The name of its own upstream block in the config."""
        return f"lethe_shard_{self.name}"


def parse_shards(text: str, *, ring: bool = True) -> list[Shard]:
    """``a=10.0.0.1:50051,b=10.0.0.2:50051`` → shards, in order.

    Raises:
        ValueError: an entry is not ``NAME=HOST:PORT``, a name is not an id,
            or a name is given twice.
    """
    shards: list[Shard] = []
    for entry in text.split(","):
        name, sep, address = entry.strip().partition("=")
        if not sep or not ID_RE.fullmatch(name):
            raise ValueError(f"shard {entry!r}: expected NAME=HOST:PORT with NAME an id")
        match = _ADDRESS_RE.fullmatch(address)
        if match is None or not 0 < int(match.group(2)) < 65536:
            raise ValueError(f"shard {name}: {address!r} is not HOST:PORT")
        if any(s.name == name for s in shards):
            raise ValueError(f"shard {name} is given twice")
        shards.append(Shard(name, address, ring))
    return shards


def parse_placement(text: str) -> tuple[str, str]:
    """``alice=c`` → ``("alice", "c")``: owner ``alice`` lives on shard ``c``.

    Raises:
        ValueError: not ``OWNER=SHARD`` with both ids.
    """
    owner, sep, shard = text.partition("=")
    if not sep or not ID_RE.fullmatch(owner) or not ID_RE.fullmatch(shard):
        raise ValueError(f"placement {text!r}: expected OWNER=SHARD (both ids)")
    return owner, shard


@dataclass(frozen=True)
class NginxPlan:
    """What :func:`nginx_config` writes.

    Attributes:
        shards: every shard, ring members first (at least one in the ring).
        placements: owner id → shard name, for owners that do not live where
            the ring puts them.
        listen: nginx's ``HOST:PORT`` for clients.
        tls_cert, tls_key: PEM files of nginx's own certificate and key (TLS
            to clients), or None for plaintext.
        upstream_ca: PEM CA bundle that signs the shards' certificates: the
            shards serve TLS (``grpcs://``) and are verified against it; None:
            plaintext to the shards.
        upstream_server_name: the name every shard certificate holds (checked
            and sent as SNI); required with ``upstream_ca``.
        upstream_cert, upstream_key: nginx's client certificate for shards
            that require mutual TLS (``lethe serve --client-ca``).
        max_message_bytes: the shards' receive limit, bytes.
        http_listen: nginx's ``HOST:PORT`` for Connect calls (HTTP), or None
            for no HTTP server block.
        http_shards: shard name → its HTTP listener's ``HOST:PORT`` (its
            ``lethe serve --http-listen``), for every shard; with ``http_listen``.
        http_route_socket: the Unix socket of the route server, which nginx
            creates (its master, as root) and asks which shard holds an owner.
        stream_timeout: seconds a call may go without a byte either way (a
            quiet ``Watch`` stream), nginx's read and send timeouts.
        connect_timeout: seconds to connect to a shard before the call answers
            ``SHARD_UNAVAILABLE``.
    """

    shards: Sequence[Shard]
    placements: dict[str, str] = field(default_factory=dict)
    listen: str = "127.0.0.1:8443"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    upstream_ca: Path | None = None
    upstream_server_name: str = ""
    upstream_cert: Path | None = None
    upstream_key: Path | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    http_listen: str | None = None
    http_shards: dict[str, str] = field(default_factory=dict)
    http_route_socket: Path = Path("/run/lethe-nginx-route.sock")
    stream_timeout: int = 3600
    connect_timeout: int = 2

    def check(self) -> None:
        """Refuse a config nginx could not serve as meant.

        Raises:
            ValueError: no ring shard, a name given twice, a placement on an unknown
                shard, TLS options that do not go together, or a message limit that
                is not positive or is 2 GiB or more.
        """
        names = [s.name for s in self.shards]
        if len(set(names)) != len(names):
            raise ValueError("a shard name is given twice")
        if not any(s.ring for s in self.shards):
            raise ValueError("at least one shard must be in the hash ring (--shards)")
        for owner, shard in self.placements.items():
            if shard not in names:
                raise ValueError(f"placement {owner}={shard}: no shard is named {shard}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if (self.upstream_cert is None) != (self.upstream_key is None):
            raise ValueError("--upstream-cert and --upstream-key go together")
        if self.upstream_ca is None and (self.upstream_cert or self.upstream_server_name):
            raise ValueError("--upstream-cert and --upstream-server-name need --upstream-ca")
        if self.upstream_ca is not None and not self.upstream_server_name:
            raise ValueError("--upstream-ca needs --upstream-server-name (in every shard's cert)")
        if not 0 < self.max_message_bytes < 1 << 31:
            raise ValueError("the message limit must be positive and below 2GiB")
        if (self.http_listen is None) != (not self.http_shards):
            raise ValueError("--http-listen and --http-shards go together")
        if self.http_shards and set(self.http_shards) != set(names):
            raise ValueError(
                "--http-shards must name every shard's HTTP listener, and only those: "
                + ", ".join(sorted(set(names) ^ set(self.http_shards)))
            )


def _grpc_error(code: int, message: str, reason: int, metadata: dict[str, str]) -> str:
    """The base64 ``grpc-status-details-bin`` value of a ``google.rpc.Status``.

    The status carries one ``ErrorInfo`` (domain ``lethe``).
    """
    info = any_pb2.Any()
    info.Pack(
        error_details_pb2.ErrorInfo(
            reason=Reason.Name(reason),  # type: ignore[arg-type]
            domain=DOMAIN,
            metadata=metadata,
        )
    )
    status = status_pb2.Status(code=code, message=message, details=[info])
    return base64.b64encode(status.SerializeToString()).decode().rstrip("=")


def _quote(value: str) -> str:
    """An nginx string literal (the values here are ids, addresses and base64)."""
    if any(c in value for c in '"\\;{}$\n'):
        raise ValueError(f"not a safe nginx value: {value!r}")
    return f'"{value}"'


def nginx_config(plan: NginxPlan) -> str:
    """The nginx config of a plan (``http {}`` level; see the module docstring).

    Raises:
        ValueError: as :meth:`NginxPlan.check`.
    """
    plan.check()
    scheme = "grpcs" if plan.upstream_ca is not None else "grpc"
    ring = [s for s in plan.shards if s.ring]
    missing_status = _grpc_error(
        code_pb2.INVALID_ARGUMENT,
        f"no {OWNER_HEADER} metadata: nothing to route on",
        Reason.OWNER_HEADER_MISSING,
        {},
    )
    lines = [
        "# Generated by `lethe shard nginx-config`; include it in nginx's http {} block",
        "# (Debian: /etc/nginx/conf.d/lethe.conf). Routes every call on its",
        f"# {OWNER_HEADER} header to the shard that holds the owner; never to another.",
        f"# Ring: {', '.join(f'{s.name}={s.address}' for s in ring)}.",
    ]
    placed = [s for s in plan.shards if not s.ring]
    if placed:
        lines.append(f"# Outside the ring: {', '.join(f'{s.name}={s.address}' for s in placed)}.")
    lines.append("")
    for shard in plan.shards:
        lines += [
            f"upstream {shard.upstream} {{",
            f"    server {shard.address} max_fails=0;",
            "    keepalive 32;",
            "}",
        ]
    lines += ["upstream lethe_ring {", "    hash $http_x_lethe_owner consistent;"]
    lines += [f"    server {s.address} max_fails=0;  # {s.name}" for s in ring]
    lines += ["    keepalive 32;", "}", ""]
    lines += ["# Owners that live elsewhere than the ring puts them."]
    lines += ["map $http_x_lethe_owner $lethe_upstream {", "    default lethe_ring;"]
    by_name = {s.name: s for s in plan.shards}
    for owner, home in sorted(plan.placements.items()):
        lines.append(f"    {_quote(owner)} {by_name[home].upstream};")
    lines += ["}", ""]
    lines += [
        f"# Health checks may name a shard ({SHARD_HEADER}: NAME) instead of an owner.",
        "map $http_x_lethe_shard $lethe_health_upstream {",
        "    default $lethe_upstream;",
    ]
    lines += [f"    {_quote(s.name)} {s.upstream};" for s in plan.shards]
    lines += ["}", ""]
    lines += [
        "# The error of a shard that cannot be reached, by its address.",
        "map $upstream_addr $lethe_unreachable {",
        "    default "
        + _quote(
            _grpc_error(
                code_pb2.UNAVAILABLE,
                "the owner's shard cannot be reached",
                Reason.SHARD_UNAVAILABLE,
                {},
            )
        )
        + ";",
    ]
    for shard in plan.shards:
        details = _grpc_error(
            code_pb2.UNAVAILABLE,
            f"shard {shard.name} ({shard.address}) cannot be reached",
            Reason.SHARD_UNAVAILABLE,
            {"shard": shard.name, "target": shard.address},
        )
        lines.append(f"    {_quote(shard.address)} {_quote(details)};")
    lines += ["}", ""]
    tls = plan.tls_cert is not None
    lines += [
        "server {",
        f"    listen {plan.listen}{' ssl' if tls else ''} http2;",
    ]
    if tls:
        lines += [
            f"    ssl_certificate {plan.tls_cert};",
            f"    ssl_certificate_key {plan.tls_key};",
            "    ssl_protocols TLSv1.2 TLSv1.3;",
        ]
    lines += [
        "    # One unary request is one message: the shards' receive limit plus gRPC's prefix.",
        f"    client_max_body_size {plan.max_message_bytes + GRPC_PREFIX_BYTES};",
        f"    client_body_timeout {plan.stream_timeout}s;",
        f"    grpc_read_timeout {plan.stream_timeout}s;",
        f"    grpc_send_timeout {plan.stream_timeout}s;",
        f"    grpc_connect_timeout {plan.connect_timeout}s;",
        "    grpc_next_upstream off;",
        "    grpc_socket_keepalive on;",
    ]
    if plan.upstream_ca is not None:
        lines += [
            f"    grpc_ssl_trusted_certificate {plan.upstream_ca};",
            "    grpc_ssl_verify on;",
            f"    grpc_ssl_name {plan.upstream_server_name};",
            "    grpc_ssl_server_name on;",
            "    grpc_ssl_protocols TLSv1.2 TLSv1.3;",
        ]
        if plan.upstream_cert is not None:
            lines += [
                f"    grpc_ssl_certificate {plan.upstream_cert};",
                f"    grpc_ssl_certificate_key {plan.upstream_key};",
            ]
    lines += [
        "    error_page 502 504 = @lethe_unreachable;",
        "    error_page 418 = @lethe_no_owner;",
        "",
        "    location /lethe.v1. {",
        '        if ($http_x_lethe_owner = "") {',
        "            return 418;",
        "        }",
        f"        grpc_pass {scheme}://$lethe_upstream;",
        "    }",
        "    location /grpc.health.v1.Health/ {",
        f"        grpc_pass {scheme}://$lethe_health_upstream;",
        "    }",
        "    location / {",
        "        # Server reflection (the public schema) and anything else: by owner if sent.",
        f"        grpc_pass {scheme}://$lethe_upstream;",
        "    }",
        "    location @lethe_unreachable {",
        "        default_type application/grpc;",
        "        add_header grpc-status 14 always;",
        '        add_header grpc-message "lethe shard unreachable" always;',
        "        add_header grpc-status-details-bin $lethe_unreachable always;",
        "        return 204;",
        "    }",
        "    location @lethe_no_owner {",
        "        default_type application/grpc;",
        "        add_header grpc-status 3 always;",
        f'        add_header grpc-message "no {OWNER_HEADER} metadata" always;',
        f"        add_header grpc-status-details-bin {_quote(missing_status)} always;",
        "        return 204;",
        "    }",
        "}",
        "",
    ]
    if plan.http_listen is not None:
        lines += _http_block(plan, scheme)
    return "\n".join(lines)


def _connect_error(code: str, message: str, reason: int, metadata: dict[str, str]) -> str:
    """A Connect error JSON with one ``ErrorInfo`` (domain ``lethe``), as nginx returns it."""
    info = error_details_pb2.ErrorInfo(
        reason=Reason.Name(reason),  # type: ignore[arg-type]
        domain=DOMAIN,
        metadata=metadata,
    )
    value = base64.b64encode(info.SerializeToString()).decode().rstrip("=")
    debug: dict[str, object] = {"reason": info.reason, "domain": DOMAIN}
    if metadata:
        debug["metadata"] = metadata
    detail = {"type": "google.rpc.ErrorInfo", "value": value, "debug": debug}
    body = json.dumps({"code": code, "message": message, "details": [detail]})
    if any(c in body for c in "'\\$\n"):
        raise ValueError(f"not a safe nginx value: {body!r}")
    return f"'{body}'"


def _upstream_tls(plan: NginxPlan, module: str) -> list[str]:
    """``module``'s (``grpc``, ``proxy``) TLS to the shards, as the plan says."""
    if plan.upstream_ca is None:
        return []
    lines = [
        f"    {module}_ssl_trusted_certificate {plan.upstream_ca};",
        f"    {module}_ssl_verify on;",
        f"    {module}_ssl_name {plan.upstream_server_name};",
        f"    {module}_ssl_server_name on;",
        f"    {module}_ssl_protocols TLSv1.2 TLSv1.3;",
    ]
    if plan.upstream_cert is not None:
        lines += [
            f"    {module}_ssl_certificate {plan.upstream_cert};",
            f"    {module}_ssl_certificate_key {plan.upstream_key};",
        ]
    return lines


def _http_block(plan: NginxPlan, scheme: str) -> list[str]:
    """The Connect (HTTP) part of the config: see the module docstring."""
    http_scheme = "https" if plan.upstream_ca is not None else "http"
    tls = plan.tls_cert is not None
    socket = str(plan.http_route_socket)
    _quote(socket)  # a path nginx can take as written
    lines = [
        "# Connect (HTTP) calls. Each goes to the shard that gRPC calls of its owner go to:",
        "# the route server below asks the gRPC ring (and the placements) which one, then the",
        "# call goes to that shard's HTTP listener.",
    ]
    for shard in plan.shards:
        lines += [
            f"upstream {shard.upstream}_http {{",
            f"    server {plan.http_shards[shard.name]} max_fails=0;",
            "    keepalive 32;",
            "}",
        ]
    lines += [
        "upstream lethe_route {",
        f"    server unix:{socket};",
        "    keepalive 16;",
        "}",
        "map $lethe_shard_address $lethe_http_upstream {",
        '    default "";',
    ]
    lines += [f"    {_quote(s.address)} {s.upstream}_http;" for s in plan.shards]
    lines += ["}", ""]
    lines += [
        "# The Connect error of a shard that cannot be reached, by its HTTP address.",
        "map $upstream_addr $lethe_http_unreachable {",
        "    default "
        + _connect_error(
            "unavailable", "the shard of the owner cannot be reached", Reason.SHARD_UNAVAILABLE, {}
        )
        + ";",
    ]
    for shard in plan.shards:
        error = _connect_error(
            "unavailable",
            f"shard {shard.name} ({shard.address}) cannot be reached",
            Reason.SHARD_UNAVAILABLE,
            {"shard": shard.name, "target": shard.address},
        )
        lines.append(f"    {_quote(plan.http_shards[shard.name])} {error};")
    lines += ["}", ""]
    lines += [
        "# The route server: which shard holds a call's owner. It sends the gRPC ring (and the",
        "# placements) a call to no method, which the shard answers at once (UNIMPLEMENTED,",
        "# nothing read), and answers with the address nginx picked. Its own socket, because",
        "# the question must be a POST (gRPC servers reset anything else) and a subrequest",
        "# is a GET: the HTTP server's subrequest is POSTed here.",
        "server {",
        f"    listen unix:{socket};",
        "    access_log off;",
        f"    grpc_connect_timeout {plan.connect_timeout}s;",
        "    grpc_next_upstream off;",
        *_upstream_tls(plan, "grpc"),
        "    location = /_lethe_route {",
        "        grpc_set_header Content-Type application/grpc;",
        "        grpc_set_header TE trailers;",
        f"        grpc_pass {scheme}://$lethe_upstream;",
        "        add_header X-Lethe-Shard $upstream_addr always;",
        "        error_page 502 504 = @lethe_route_down;",
        "    }",
        "    location @lethe_route_down {",
        "        # The shard is down: the call fails at its HTTP listener, naming it.",
        "        add_header X-Lethe-Shard $upstream_addr always;",
        "        return 204;",
        "    }",
        "    location / {",
        "        return 404;",
        "    }",
        "}",
        "",
    ]
    missing = _connect_error(
        "invalid_argument",
        f"no {OWNER_HEADER} header: nothing to route on",
        Reason.OWNER_HEADER_MISSING,
        {},
    )
    lines += [
        "server {",
        f"    listen {plan.http_listen}{' ssl http2' if tls else ''};",
    ]
    if tls:
        lines += [
            f"    ssl_certificate {plan.tls_cert};",
            f"    ssl_certificate_key {plan.tls_key};",
            "    ssl_protocols TLSv1.2 TLSv1.3;",
        ]
    lines += [
        "    # The shards' receive limit, plus a stream's envelope prefix and gzip's overhead.",
        f"    client_max_body_size {plan.max_message_bytes + CONNECT_BODY_SLACK};",
        f"    client_body_timeout {plan.stream_timeout}s;",
        f"    proxy_read_timeout {plan.stream_timeout}s;",
        f"    proxy_send_timeout {plan.stream_timeout}s;",
        f"    proxy_connect_timeout {plan.connect_timeout}s;",
        "    proxy_next_upstream off;",
        "    proxy_http_version 1.1;",
        '    proxy_set_header Connection "";',
        "    # Watch events go to the client as they come.",
        "    proxy_buffering off;",
        *_upstream_tls(plan, "proxy"),
        "",
        "    location /lethe.v1. {",
        '        if ($http_x_lethe_owner = "") {',
        "            return 418;",
        "        }",
        "        auth_request /_lethe_shard;",
        "        auth_request_set $lethe_shard_address $upstream_http_x_lethe_shard;",
        "        error_page 418 = @lethe_http_no_owner;",
        "        error_page 500 502 504 = @lethe_http_unreachable;",
        f"        proxy_pass {http_scheme}://$lethe_http_upstream;",
        "    }",
        "    location = /_lethe_shard {",
        "        internal;",
        "        proxy_pass http://lethe_route/_lethe_route;",
        "        proxy_method POST;",
        "        proxy_pass_request_body off;",
        '        proxy_set_header Content-Length "";',
        '        proxy_set_header Authorization "";',
        "    }",
        "    location / {",
        "        return 404;",
        "    }",
        "    location @lethe_http_unreachable {",
        "        default_type application/json;",
        "        return 503 $lethe_http_unreachable;",
        "    }",
        "    location @lethe_http_no_owner {",
        "        default_type application/json;",
        f"        return 400 {missing};",
        "    }",
        "}",
        "",
    ]
    return lines
