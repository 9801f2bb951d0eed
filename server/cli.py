"""The ``lethe`` command line (API.md, "Command line").

``lethe serve``, ``lethe token create | list | revoke``, ``lethe backup``,
``lethe restore``, ``lethe audit``, ``lethe probe`` and ``lethe demo``. Errors
are printed as one line on stderr with exit status 2 (usage or configuration)
or 1 (a failed check, or no such token to revoke).

``lethe token`` works on the data directory of a running server (tokens are
read on every call): a new token works at once, a revoked or expired one is
refused within a second, open streams included.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from lethe.probe import add_probe_arguments
from server._auth import LABEL_RE, new_token, token_digest
from server._names import ID_RE
from server._shards import add_serve_arguments, add_shard_commands, run_shard_command
from server.store import Store, StoreLockedError, acquire_lock, data_paths, open_store_for
from shredder import (
    EnvironmentConfigError,
    Keystore,
    ShredderError,
    backup_environment,
    check_kek_placement,
    declare,
    default_kek_path,
    failpoint,
    restore_environment,
)

FP_RESTORE_AFTER_REPLACE = declare(
    "restore.after_replace",
    "lethe restore replaced the data environment; start-up recovery has not run",
)
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``72h``, ``30m``, ``10s``, ``1d``, ``500ms`` or ``1h30m`` → seconds.

    Raises:
        argparse.ArgumentTypeError: malformed or zero.
    """
    parts = _DURATION_RE.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (examples: 72h, 30m, 1h30m)")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError("duration must be positive")
    return seconds


_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


def parse_size(text: str) -> int:
    """``64GiB``, ``512MiB``, ``10GB`` or a number of bytes → bytes (≥ 1 MiB).

    Raises:
        argparse.ArgumentTypeError: malformed, or below 1 MiB.
    """
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 64GiB, 512MiB, 10GB)")
    size = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if size < 1 << 20:
        raise argparse.ArgumentTypeError("the store's maximum size must be at least 1MiB")
    return size


def parse_message_size(text: str) -> int:
    """A gRPC message limit: ``16MiB``, ``512KiB``, ``1048576`` (at most 2 GiB - 1) → bytes.

    Raises:
        argparse.ArgumentTypeError: malformed, zero or too large for gRPC.
    """
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 16MiB, 512KiB, 65536)")
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    if not 0 < size < 1 << 31:
        raise argparse.ArgumentTypeError("size must be positive and below 2GiB")
    return size


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _label(value: str) -> str:
    if not LABEL_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            "labels match [A-Za-z0-9][A-Za-z0-9._-]{0,63} (stored in plaintext: no content)"
        )
    return value


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with PORT in 0..65535, got {value!r}")
    return value


def _address_or_off(value: str) -> str:
    return value if value == "off" else _address(value)


def _embedder(value: str) -> str:
    """``wordllama``, ``none`` or ``onnx:DIR`` with DIR an existing directory."""
    if value in ("wordllama", "none"):
        return value
    directory = value[len("onnx:") :] if value.startswith("onnx:") else ""
    if not directory:
        raise argparse.ArgumentTypeError(f"expected wordllama, none or onnx:DIR, got {value!r}")
    if not Path(directory).is_dir():
        raise argparse.ArgumentTypeError(f"onnx:{directory}: no such directory")
    return value


def _owner(value: str) -> str:
    if not ID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError("owner ids match [a-z0-9][a-z0-9-]{0,62}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lethe", description="Lethe memory store")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the gRPC API")
    serve.add_argument("--data", type=Path, default=Path("./lethe-data"))
    serve.add_argument(
        "--listen",
        type=_address,
        default="127.0.0.1:50051",
        help="HOST:PORT for gRPC (default 127.0.0.1:50051)",
    )
    serve.add_argument(
        "--metrics-listen",
        type=_address_or_off,
        default="127.0.0.1:9464",
        help="HOST:PORT for /metrics, or 'off' (default 127.0.0.1:9464)",
    )
    serve.add_argument("--kek-file", type=Path, default=None)
    serve.add_argument(
        "--embedder",
        type=_embedder,
        default="wordllama",
        help="wordllama (default, in its wheel), none (clients send vectors) or onnx:DIR "
        "(a sentence encoder's model.onnx and tokenizer.json in DIR; the onnx extra). "
        "A change re-embeds each owner's vectors on its first use",
    )
    serve.add_argument("--pending-ttl", type=parse_duration, default=parse_duration("72h"))
    serve.add_argument("--sweep-interval", type=parse_duration, default=parse_duration("5s"))
    serve.add_argument(
        "--rotation-interval",
        type=parse_duration,
        default=parse_duration("1h"),
        help="complete shreds cryptographically this often (default 1h)",
    )
    serve.add_argument(
        "--index-cache-size",
        type=parse_size,
        default=parse_size("4GiB"),
        help="bytes of in-memory search indexes kept (estimated); past it the least recently "
        "searched owners' indexes are dropped and rebuilt from the store on their next search "
        "(default 4GiB)",
    )
    serve.add_argument(
        "--max-store-size",
        type=parse_size,
        default=parse_size("64GiB"),
        help="the data environment grows on demand up to this size; a write that does not "
        "fit is refused whole with STORE_FULL (default 64GiB; units B, KiB, MiB, GiB, TiB)",
    )
    serve.add_argument(
        "--tagger",
        choices=["rules", "none"],
        default="rules",
        help="propose candidate memories for untagged turns (default rules)",
    )
    bounds = serve.add_argument_group(
        "concurrency", "past a bound a call is refused at once with RESOURCE_EXHAUSTED"
    )
    bounds.add_argument(
        "--workers", type=_positive_int, default=16, help="threads for blocking work (16)"
    )
    bounds.add_argument(
        "--max-inflight", type=_positive_int, default=64, help="unary calls at once, in all (64)"
    )
    bounds.add_argument(
        "--max-inflight-per-principal",
        type=_positive_int,
        default=16,
        help="unary calls at once per token (16)",
    )
    bounds.add_argument(
        "--max-running-per-principal",
        type=_positive_int,
        default=4,
        help="of those, calls of one token running at once (4)",
    )
    bounds.add_argument(
        "--max-streams", type=_positive_int, default=1024, help="open Watch streams, in all (1024)"
    )
    bounds.add_argument(
        "--max-streams-per-principal",
        type=_positive_int,
        default=128,
        help="open Watch streams per token (128)",
    )
    transport = serve.add_argument_group("transport")
    transport.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate chain")
    transport.add_argument("--tls-key", type=Path, default=None, help="PEM private key")
    transport.add_argument(
        "--client-ca",
        type=Path,
        default=None,
        help="PEM CAs of client certificates: clients must present one (mutual TLS)",
    )
    transport.add_argument(
        "--max-receive-message-size", type=parse_message_size, default=parse_message_size("16MiB")
    )
    transport.add_argument(
        "--max-send-message-size", type=parse_message_size, default=parse_message_size("16MiB")
    )
    transport.add_argument(
        "--keepalive-min-interval",
        type=parse_duration,
        default=parse_duration("10s"),
        help="accept client keepalive pings this far apart or more (10s)",
    )
    transport.add_argument(
        "--keepalive-time",
        type=parse_duration,
        default=parse_duration("60s"),
        help="ping an idle connection this often (60s)",
    )
    transport.add_argument(
        "--keepalive-timeout",
        type=parse_duration,
        default=parse_duration("20s"),
        help="drop a connection whose ping is unanswered this long (20s)",
    )
    transport.add_argument(
        "--drain-grace",
        type=parse_duration,
        default=parse_duration("30s"),
        help="on SIGTERM, time given to calls in flight (30s)",
    )

    add_serve_arguments(serve)
    add_shard_commands(sub, message_size=parse_message_size, address=_address, owner=_owner)

    token = sub.add_parser("token", help="create, list and revoke bearer tokens")
    token_sub = token.add_subparsers(dest="action", required=True)
    create = token_sub.add_parser("create", help="print a new bearer token")
    create.add_argument("--data", type=Path, default=Path("./lethe-data"))
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument("--owner", type=_owner, action="append", dest="owners")
    who.add_argument("--admin", action="store_true")
    create.add_argument("--label", type=_label, default=None, help="a name for it (no content)")
    create.add_argument(
        "--expires-in", type=parse_duration, default=None, help="refuse it after this (e.g. 30d)"
    )
    create.add_argument("--kek-file", type=Path, default=None)
    listing = token_sub.add_parser("list", help="list tokens (ids, never secrets)")
    listing.add_argument("--data", type=Path, default=Path("./lethe-data"))
    listing.add_argument("--kek-file", type=Path, default=None)
    revoke = token_sub.add_parser("revoke", help="revoke a token by id (takes effect within 1 s)")
    revoke.add_argument("id", help="the token's id, as `lethe token list` shows it")
    revoke.add_argument("--data", type=Path, default=Path("./lethe-data"))
    revoke.add_argument("--kek-file", type=Path, default=None)

    backup = sub.add_parser("backup", help="consistent compacted copy of the data environment")
    backup.add_argument("--data", type=Path, default=Path("./lethe-data"))
    backup.add_argument("--out", type=Path, required=True)
    backup.add_argument("--kek-file", type=Path, default=None)

    rotate = sub.add_parser(
        "rotate", help="complete pending shreds now: new ring and KEK keys (server stopped)"
    )
    rotate.add_argument("--data", type=Path, default=Path("./lethe-data"))
    rotate.add_argument("--kek-file", type=Path, default=None)

    audit_p = sub.add_parser(
        "audit", help="print the AuditReport of every owner; exit 1 if any count is non-zero"
    )
    audit_p.add_argument("--data", type=Path, default=Path("./lethe-data"))
    audit_p.add_argument("--kek-file", type=Path, default=None)

    restore = sub.add_parser("restore", help="restore a data backup beside the keystore")
    restore.add_argument("--backup", type=Path, required=True)
    restore.add_argument("--data", type=Path, default=Path("./lethe-data"))
    restore.add_argument("--kek-file", type=Path, default=None)

    demo = sub.add_parser("demo", help="ingest LoCoMo, measure recall, forget, back up, restore")
    demo.add_argument("--data", type=Path, default=Path("./lethe-data"))
    demo.add_argument(
        "--locomo",
        type=Path,
        default=None,
        help="path of locomo10.json (default ../shared/data/locomo/locomo10.json)",
    )
    demo.add_argument("--out", type=Path, default=Path("demo-results.json"))
    demo.add_argument(
        "--conversations", type=int, default=0, help="use only the first N conversations (0 = all)"
    )
    demo.add_argument("--kek-file", type=Path, default=None)

    probe = sub.add_parser("probe", help="plant-and-delete probe against a running server")
    add_probe_arguments(probe)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from server._app import LetheServer, ServerConfig

    config = ServerConfig(
        data_dir=args.data,
        listen=args.listen,
        metrics_listen=None if args.metrics_listen == "off" else args.metrics_listen,
        kek_file=args.kek_file,
        embedder=args.embedder,
        pending_ttl=args.pending_ttl,
        sweep_interval=args.sweep_interval,
        tagger=args.tagger,
        rotation_interval=args.rotation_interval,
        max_workers=args.workers,
        max_inflight=args.max_inflight,
        max_inflight_per_principal=args.max_inflight_per_principal,
        max_running_per_principal=args.max_running_per_principal,
        max_streams=args.max_streams,
        max_streams_per_principal=args.max_streams_per_principal,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        client_ca=args.client_ca,
        max_receive_message_bytes=args.max_receive_message_size,
        max_send_message_bytes=args.max_send_message_size,
        keepalive_min_interval=args.keepalive_min_interval,
        keepalive_time=args.keepalive_time,
        keepalive_timeout=args.keepalive_timeout,
        max_store_size=args.max_store_size,
        index_cache_size=args.index_cache_size,
        require_owner_header=args.require_owner_header,
    )
    try:
        config.limits()
        config.server_credentials()
    except ValueError as exc:
        print(f"lethe: {exc}", file=sys.stderr)
        return 2
    server = LetheServer(config)
    try:
        port = server.start()
    except BaseException:
        server.stop(grace=0)
        raise
    print(
        f"lethe serving {args.data.resolve()} on {args.listen.rpartition(':')[0]}:{port}",
        flush=True,
    )
    print(_kek_line(server.store.kek.path, args.data), flush=True)
    stopped = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        print(f"lethe: signal {signum}, shutting down", file=sys.stderr, flush=True)
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopped.wait()
    server.stop(grace=args.drain_grace)
    return 0


def _kek_line(path: Path | None, data: Path) -> str:
    """The second line ``lethe serve`` prints: where the store's KEK is."""
    if path is None:
        return "lethe KEK in memory (LETHE_KEK): never rotated, never written anywhere"
    return (
        f"lethe KEK {path} (outside {data}: removing the data directory leaves it behind; "
        "never back it up with the keystore)"
    )


def _token_store(args: argparse.Namespace) -> Store:
    if Keystore.read_store_id(data_paths(args.data.resolve())[1]) is None:
        raise EnvironmentConfigError(
            f"{args.data} holds no lethe store; start `lethe serve --data {args.data}` once "
            "first, or pass the data directory the server uses"
        )
    return Store(args.data, kek_file=args.kek_file, lock=False)


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)) if seconds else "-"


def _token(args: argparse.Namespace) -> int:
    """``lethe token create | list | revoke``: the token prints on stdout alone
    (for ``T=$(lethe token create ...)``), everything else about it on stderr."""
    store = _token_store(args)
    try:
        if args.action == "create":
            token = new_token()
            expire = time.time() + args.expires_in if args.expires_in else 0.0
            row = store.create_token(
                token_digest(token),
                args.owners or [],
                args.admin,
                label=args.label or "",
                expire_time=expire,
            )
            print(token)
            print(f"lethe: token {row.id} created; expires {_when(expire)}", file=sys.stderr)
            return 0
        if args.action == "list":
            now = time.time()
            print(f"{'id':<16}  {'state':<8}  {'created':<20}  {'expires':<20}  label  acts for")
            for row in store.tokens():
                state = "revoked" if row.revoke_time else "active" if row.active(now) else "expired"
                who = "admin" if row.admin else ",".join(row.owners)
                print(
                    f"{row.id:<16}  {state:<8}  {_when(row.create_time):<20}  "
                    f"{_when(row.expire_time):<20}  {row.label or '-'}  {who}"
                )
            return 0
        revoked = store.revoke_token(args.id)
        if revoked is None:
            print(f"lethe: no token has id {args.id!r} (see `lethe token list`)", file=sys.stderr)
            return 1
        print(f"revoked {revoked.id} at {_when(revoked.revoke_time)}")
        return 0
    finally:
        store.close()


def _kek_path(data: Path, kek_file: Path | None) -> Path | None:
    store_id = Keystore.read_store_id(data_paths(data.resolve())[1])
    if kek_file is not None:
        return kek_file
    return default_kek_path(store_id) if store_id else None


def _backup(args: argparse.Namespace) -> int:
    data_env, ks_path = data_paths(args.data.resolve())
    store_id = Keystore.read_store_id(ks_path)
    if store_id is None or not (data_env / "data.mdb").exists():
        raise EnvironmentConfigError(f"{args.data} holds no lethe store")
    kek = _kek_path(args.data, args.kek_file)
    if kek is not None:
        check_kek_placement(kek, [args.out])
    if args.out.resolve().is_relative_to(args.data.resolve()):
        raise EnvironmentConfigError("the backup directory must be outside the data directory")
    live = open_store_for(args.data)
    manifest = backup_environment(
        data_env, args.out, store_id, env=live.env if live is not None else None
    )
    print(
        f"backup of {args.data} written to {args.out} ({manifest.bytes} bytes, "
        f"sha256 {manifest.sha256[:16]}…); keystore and KEK not included"
    )
    return 0


def _rotate(args: argparse.Namespace) -> int:
    """Rotate with the server stopped: a running server holds the KEK in memory
    and rotates itself every ``--rotation-interval``."""
    if Keystore.read_store_id(data_paths(args.data.resolve())[1]) is None:
        raise EnvironmentConfigError(f"{args.data} holds no lethe store")
    try:
        store = Store(args.data, kek_file=args.kek_file)
    except StoreLockedError:
        raise StoreLockedError(
            f"{args.data} is served by a running lethe; it rotates every --rotation-interval "
            "(stop it to rotate now)"
        ) from None
    try:
        renewed, rewrapped, retired = store.rotate()
    finally:
        store.close()
    print(
        f"rotated: {renewed} rings renewed, {rewrapped} ring keys moved to a new KEK version, "
        f"KEK versions {retired} destroyed"
    )
    return 0


def _audit(args: argparse.Namespace) -> int:
    """Audit every owner from this process (safe beside a running server: reads
    only). Index drift is checked by ``Lifecycle.Audit`` on the server, which
    holds the indexes; here it is always 0."""
    from dataclasses import asdict

    from server.store import AuditCounts

    if Keystore.read_store_id(data_paths(args.data.resolve())[1]) is None:
        raise EnvironmentConfigError(f"{args.data} holds no lethe store")
    store = Store(args.data, kek_file=args.kek_file, lock=False)
    total = AuditCounts()
    try:
        for owner in store.owners():
            counts = store.audit(owner)
            for key, value in asdict(counts).items():
                setattr(total, key, getattr(total, key) + value)
            if not counts.healthy():
                print(f"owners/{owner}: {asdict(counts)}")
    finally:
        store.close()
    for key, value in asdict(total).items():
        print(f"{key}: {value}")
    return 0 if total.healthy() else 1


def _restore(args: argparse.Namespace) -> int:
    from index import load_embedder
    from server._lifecycle import Lifecycle
    from server._metrics import Metrics
    from server._search import Retriever

    data_env, ks_path = data_paths(args.data.resolve())
    store_id = Keystore.read_store_id(ks_path)
    if store_id is None:
        raise EnvironmentConfigError(f"{args.data} has no keystore to restore beside")
    import os

    fd = acquire_lock(args.data.resolve())
    try:
        restore_environment(args.backup, data_env, store_id)
    finally:
        os.close(fd)
    store = Store(args.data, kek_file=args.kek_file)
    try:
        lifecycle = Lifecycle(store, Retriever(store, load_embedder("none")), Metrics())
        failpoint(FP_RESTORE_AFTER_REPLACE)
        recovery = lifecycle.recover()
    finally:
        store.close()
    kept = len(recovery.kept_without_key)
    print(
        f"restored {args.backup} into {args.data}: {recovery.forgotten} turns and memories "
        f"whose keys were destroyed since the backup are forgotten; "
        f"{recovery.deletions_resumed} deletions resumed"
        + (f"; {kept} records without a key kept (see the log, lethe audit)" if kept else "")
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lethe`` console script."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "token":
            return _token(args)
        if args.command == "backup":
            return _backup(args)
        if args.command == "restore":
            return _restore(args)
        if args.command == "audit":
            return _audit(args)
        if args.command == "rotate":
            return _rotate(args)
        if args.command == "demo":
            from lethe.demo import run_demo

            return run_demo(args)
        if args.command == "shard":
            return run_shard_command(args, lambda: _token_store(args))
        if args.command == "probe":
            from lethe.probe import run_probe

            return run_probe(args)
    except (EnvironmentConfigError, StoreLockedError, ShredderError, OSError) as exc:
        print(f"lethe: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
