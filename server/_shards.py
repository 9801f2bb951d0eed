"""Owners sharded across servers behind nginx: the generated config and the
``lethe shard`` commands.

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
  message), and the read/send timeouts are long enough for ``Watch`` streams.

The moved-away markers (``lethe shard mark-moved``) are the shard side of a
placement: a shard that no longer holds an owner answers ``OWNER_MOVED``
naming where it went (:mod:`server._routing`). Tokens are per data
directory; ``lethe shard token-import`` stores a token made on one shard on
another, so one token works through the proxy. ``lethe shard audit`` reads
the periodic audit's gauges from every shard's ``/metrics`` in one command.

Thread rules: none (pure functions and one-shot commands).
"""

from __future__ import annotations

import argparse
import base64
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from lethe.names import ID_RE, OWNER_HEADER
from server.errors import DOMAIN, Reason

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "NginxPlan",
    "Shard",
    "add_serve_arguments",
    "add_shard_commands",
    "nginx_config",
    "parse_placement",
    "parse_shards",
    "run_shard_command",
    "shard_audit",
]

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The servers' default receive limit, bytes (``lethe serve --max-receive-message-size``)."""
GRPC_PREFIX_BYTES = 5
"""Bytes gRPC puts before each message on the wire (1 flag byte, 4 length bytes)."""
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
    stream_timeout: int = 3600
    connect_timeout: int = 2

    def check(self) -> None:
        """Raises ValueError: no ring shard, a name given twice, a placement on an
        unknown shard, or TLS options that do not go together."""
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


def _grpc_error(code: int, message: str, reason: int, metadata: dict[str, str]) -> str:
    """The base64 ``grpc-status-details-bin`` value of a ``google.rpc.Status``
    with one ``ErrorInfo`` (domain ``lethe``)."""
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
    return "\n".join(lines)


AUDIT_GAUGES = (
    "lethe_orphan_derivatives",
    "lethe_stale_summaries",
    "lethe_records_without_key",
    "lethe_unreadable_records",
    "lethe_outstanding_deletions",
)
"""The gauges of each shard's periodic audit that ``lethe shard audit`` reads
(all zero in a healthy store, API.md "Metrics")."""


def shard_audit(shards: Sequence[Shard], *, timeout: float = 5.0) -> dict[str, dict[str, float]]:
    """Read the audit gauges of every shard's ``/metrics`` (``Shard.address`` is
    its ``--metrics-listen``).

    Args:
        shards: the shards, with their metrics addresses.
        timeout: seconds per scrape.

    Returns:
        shard name → gauge → value; a shard that cannot be scraped maps to
        ``{}`` (and a gauge it does not export is missing from its dict).
    """
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for shard in shards:
        try:
            with urllib.request.urlopen(
                f"http://{shard.address}/metrics", timeout=timeout
            ) as reply:
                text = reply.read().decode()
        except OSError:
            out[shard.name] = {}
            continue
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name in AUDIT_GAUGES:
                values[family.name] = sum(sample.value for sample in family.samples)
        out[shard.name] = values
    return out


def _print_audit(found: dict[str, dict[str, float]]) -> int:
    """Print one line per shard and the totals; 0 when every shard answered
    with every gauge at zero, else 1."""
    healthy = True
    totals = dict.fromkeys(AUDIT_GAUGES, 0.0)
    for name, values in found.items():
        if not values:
            print(f"{name}: unreachable (no /metrics)")
            healthy = False
            continue
        missing = [g for g in AUDIT_GAUGES if g not in values]
        healthy = healthy and not missing and not any(values.values())
        for gauge, value in values.items():
            totals[gauge] += value
        cells = " ".join(f"{g.removeprefix('lethe_')}={values[g]:g}" for g in values)
        print(f"{name}: {cells}" + (f" missing={','.join(missing)}" if missing else ""))
    print("all: " + " ".join(f"{g.removeprefix('lethe_')}={v:g}" for g, v in totals.items()))
    return 0 if healthy else 1


_TOKEN_RE = re.compile(r"lethe_[A-Za-z0-9_-]{43}")


def _import_token(store: Any, args: argparse.Namespace) -> int:
    """``lethe shard token-import``: the token on stdin (as ``lethe token create``
    printed it on another shard) stored here by its digest; 1 if malformed."""
    from server._auth import LABEL_RE, token_digest

    token = sys.stdin.readline().strip()
    if not _TOKEN_RE.fullmatch(token):
        print("lethe: stdin holds no lethe token (lethe_ and 43 characters)", file=sys.stderr)
        return 1
    if args.label and not LABEL_RE.fullmatch(args.label):
        print("lethe: labels match [A-Za-z0-9][A-Za-z0-9._-]{0,63}", file=sys.stderr)
        return 1
    try:
        row = store.create_token(
            token_digest(token), args.owners or [], args.admin, label=args.label
        )
    except ValueError as exc:  # the same token imported twice
        print(f"lethe: {exc}", file=sys.stderr)
        return 1
    who = "admin" if row.admin else ",".join(row.owners)
    print(f"lethe: token {row.id} stored for {who}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------- command line


def add_serve_arguments(serve: argparse.ArgumentParser) -> None:
    """Add the sharding flags of ``lethe serve`` (``--require-owner-header``)."""
    serve.add_argument(
        "--require-owner-header",
        action="store_true",
        help=f"refuse calls without {OWNER_HEADER} metadata (OWNER_HEADER_MISSING): "
        "for shards behind a proxy that routes on it",
    )


def add_shard_commands(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    *,
    message_size: Callable[[str], int],
    address: Callable[[str], str],
    owner: Callable[[str], str],
) -> None:
    """Add ``lethe shard nginx-config | audit | mark-moved | unmark-moved | moved |
    token-import``.

    Args:
        sub: the ``lethe`` subcommands.
        message_size, address, owner: the CLI's parsers of a message size,
            a ``HOST:PORT`` and an owner id (argparse types).
    """

    def shards(ring: bool) -> Callable[[str], list[Shard]]:
        def parse(text: str) -> list[Shard]:
            try:
                return parse_shards(text, ring=ring)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        return parse

    def placement(text: str) -> tuple[str, str]:
        try:
            return parse_placement(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    shard = sub.add_parser("shard", help="owners sharded across servers behind nginx")
    actions = shard.add_subparsers(dest="action", required=True)
    conf = actions.add_parser(
        "nginx-config", help="write the nginx config that routes each owner to its shard"
    )
    conf.add_argument(
        "--shards",
        type=shards(True),
        required=True,
        help="the hash ring: NAME=HOST:PORT,... (each a lethe serve)",
    )
    conf.add_argument(
        "--placed-shards",
        type=shards(False),
        default=[],
        help="shards outside the ring, serving only owners placed on them: NAME=HOST:PORT,...",
    )
    conf.add_argument(
        "--placement",
        type=placement,
        action="append",
        default=[],
        help="OWNER=SHARD: the owner lives on SHARD, wherever the ring would put it (repeat)",
    )
    conf.add_argument("--listen", type=address, default="127.0.0.1:8443")
    conf.add_argument("--tls-cert", type=Path, default=None, help="nginx's PEM certificate")
    conf.add_argument("--tls-key", type=Path, default=None, help="nginx's PEM private key")
    conf.add_argument(
        "--upstream-ca", type=Path, default=None, help="the shards serve TLS signed by this CA"
    )
    conf.add_argument(
        "--upstream-server-name", default="", help="the name in every shard's certificate"
    )
    conf.add_argument("--upstream-cert", type=Path, default=None, help="for mTLS shards")
    conf.add_argument("--upstream-key", type=Path, default=None, help="for mTLS shards")
    conf.add_argument(
        "--max-receive-message-size",
        type=message_size,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="the shards' --max-receive-message-size (16MiB)",
    )
    conf.add_argument("--out", type=Path, default=None, help="write here (default stdout)")

    mark = actions.add_parser(
        "mark-moved", help="this shard no longer holds OWNER: calls answer OWNER_MOVED"
    )
    mark.add_argument("--data", type=Path, default=Path("./lethe-data"))
    mark.add_argument("--kek-file", type=Path, default=None)
    mark.add_argument("--owner", type=owner, required=True)
    mark.add_argument("--to", type=owner, required=True, help="the destination shard's name")
    mark.add_argument("--target", type=address, default=None, help="its HOST:PORT")
    unmark = actions.add_parser("unmark-moved", help="serve OWNER here again")
    unmark.add_argument("--data", type=Path, default=Path("./lethe-data"))
    unmark.add_argument("--kek-file", type=Path, default=None)
    unmark.add_argument("--owner", type=owner, required=True)
    listing = actions.add_parser("moved", help="list the owners marked moved away")
    listing.add_argument("--data", type=Path, default=Path("./lethe-data"))
    listing.add_argument("--kek-file", type=Path, default=None)
    audit = actions.add_parser(
        "audit",
        help="the periodic audit of every shard in one command: exit 1 if a count is "
        "non-zero or a shard does not answer",
    )
    audit.add_argument(
        "--metrics",
        type=shards(True),
        required=True,
        help="each shard's --metrics-listen: NAME=HOST:PORT,...",
    )
    imported = actions.add_parser(
        "token-import",
        help="store a token made on another shard (read from stdin) here too, so one "
        "token works through the proxy on every shard",
    )
    imported.add_argument("--data", type=Path, default=Path("./lethe-data"))
    imported.add_argument("--kek-file", type=Path, default=None)
    who = imported.add_mutually_exclusive_group(required=True)
    who.add_argument("--owner", type=owner, action="append", dest="owners")
    who.add_argument("--admin", action="store_true")
    imported.add_argument("--label", default="", help="a name for it (no content)")


def run_shard_command(args: argparse.Namespace, open_store: Callable[[], object]) -> int:
    """Run ``lethe shard …``; returns the exit status (2 for a bad plan).

    Args:
        args: the parsed command line.
        open_store: opens the ``--data`` store beside a running server (for
            the marker commands).
    """
    if args.action == "audit":
        return _print_audit(shard_audit(args.metrics))
    if args.action == "nginx-config":
        plan = NginxPlan(
            shards=[*args.shards, *args.placed_shards],
            placements=dict(args.placement),
            listen=args.listen,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            upstream_ca=args.upstream_ca,
            upstream_server_name=args.upstream_server_name,
            upstream_cert=args.upstream_cert,
            upstream_key=args.upstream_key,
            max_message_bytes=args.max_receive_message_size,
        )
        try:
            text = nginx_config(plan)
        except ValueError as exc:
            print(f"lethe: {exc}", file=sys.stderr)
            return 2
        if args.out is None:
            sys.stdout.write(text)
        else:
            args.out.write_text(text)
            print(f"lethe: nginx config for {len(plan.shards)} shards written to {args.out}")
        return 0
    from server.store import Store

    store = open_store()
    assert isinstance(store, Store)
    try:
        if args.action == "mark-moved":
            row = store.mark_moved(args.owner, args.to, args.target or "")
            where = row.shard + (f" ({row.target})" if row.target else "")
            print(f"owners/{row.owner} marked moved to {where}: calls here answer OWNER_MOVED")
        elif args.action == "unmark-moved":
            had = store.clear_moved(args.owner)
            print(f"owners/{args.owner} " + ("served here again" if had else "was not marked"))
        elif args.action == "token-import":
            return _import_token(store, args)
        else:
            for row in store.moved_owners():
                print(f"owners/{row.owner}\t{row.shard}\t{row.target or '-'}")
    finally:
        store.close()
    return 0
