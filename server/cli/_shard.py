"""``lethe shard``: owners sharded across servers behind nginx.

``nginx-config`` writes the config that routes every call on its
``x-lethe-owner`` header to the shard that holds the owner
(:mod:`server.cli._nginx`, where the routing rules are described). The
moved-away markers (``mark-moved``, ``unmark-moved``, ``moved``) are the
shard side of a placement: a shard that no longer holds an owner answers
``OWNER_MOVED`` naming where it went (:mod:`server.edge._routing`). Tokens are
per data directory; ``token-import`` stores a token made on one shard on
another, so one token works through the proxy. ``audit`` reads the periodic
audit's gauges from every shard's ``/metrics`` in one command.

Thread rules: none (one-shot commands).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lethe._units import parse_message_size
from server.cli._common import EXIT_USAGE, Subcommands, address, open_beside, owner_id
from server.cli._nginx import (
    DEFAULT_MAX_MESSAGE_BYTES,
    NginxPlan,
    Shard,
    nginx_config,
    parse_placement,
    parse_shards,
)

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
    """Read the audit gauges of every shard's ``/metrics``.

    ``Shard.address`` is its ``--metrics-listen``.

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
    """Print one line per shard and the totals.

    Returns 0 when every shard answered with every gauge at zero, else 1.
    """
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
    """``lethe shard token-import``: store the token on stdin here by its digest.

    The token is read as ``lethe token create`` printed it on another shard.
    Returns 1 if it is malformed.
    """
    from server.edge import LABEL_RE, token_digest

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


def add(sub: Subcommands) -> None:
    """Add ``lethe shard`` and its actions to ``sub``.

    The actions: ``nginx-config``, ``audit``, ``mark-moved``, ``unmark-moved``,
    ``moved`` and ``token-import``.
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
    shard.set_defaults(run=run)
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
        type=parse_message_size,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="the shards' --max-receive-message-size (16MiB)",
    )
    conf.add_argument(
        "--http-listen",
        type=address,
        default=None,
        help="nginx's HOST:PORT for Connect calls (HTTP), routed to the same shard as gRPC "
        "(default: none; needs --http-shards)",
    )
    conf.add_argument(
        "--http-shards",
        type=shards(True),
        default=[],
        help="each shard's --http-listen: NAME=HOST:PORT,... (every shard of --shards and "
        "--placed-shards)",
    )
    conf.add_argument(
        "--http-route-socket",
        type=Path,
        default=Path("/run/lethe-nginx-route.sock"),
        help="the Unix socket of nginx's own route server, which Connect calls ask which shard "
        "holds their owner (nginx creates it)",
    )
    conf.add_argument("--out", type=Path, default=None, help="write here (default stdout)")

    mark = actions.add_parser(
        "mark-moved", help="this shard no longer holds OWNER: calls answer OWNER_MOVED"
    )
    mark.add_argument("--data", type=Path, default=Path("./lethe-data"))
    mark.add_argument("--kek-file", type=Path, default=None)
    mark.add_argument("--owner", type=owner_id, required=True)
    mark.add_argument("--to", type=owner_id, required=True, help="the destination shard's name")
    mark.add_argument("--target", type=address, default=None, help="its HOST:PORT")
    unmark = actions.add_parser("unmark-moved", help="serve OWNER here again")
    unmark.add_argument("--data", type=Path, default=Path("./lethe-data"))
    unmark.add_argument("--kek-file", type=Path, default=None)
    unmark.add_argument("--owner", type=owner_id, required=True)
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
    who.add_argument("--owner", type=owner_id, action="append", dest="owners")
    who.add_argument("--admin", action="store_true")
    imported.add_argument("--label", default="", help="a name for it (no content)")


def run(args: argparse.Namespace) -> int:
    """Run ``lethe shard ACTION``; returns the exit status (2 for a bad plan).

    Raises:
        EnvironmentConfigError: a marker or token command's ``--data`` holds no store.
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
            http_listen=args.http_listen,
            http_shards={s.name: s.address for s in args.http_shards},
            http_route_socket=args.http_route_socket,
        )
        try:
            text = nginx_config(plan)
        except ValueError as exc:
            print(f"lethe: {exc}", file=sys.stderr)
            return EXIT_USAGE
        if args.out is None:
            sys.stdout.write(text)
        else:
            args.out.write_text(text)
            print(f"lethe: nginx config for {len(plan.shards)} shards written to {args.out}")
        return 0
    store = open_beside(args)
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
