"""The ``lethe`` command line (API.md, "Command line"; README, "The command
line for scripts").

``lethe serve``, ``lethe token create | list | revoke``, ``lethe backup``,
``lethe restore``, ``lethe rotate``, ``lethe audit``, ``lethe probe`` and
``lethe demo``.

Settings: every long flag comes from the command line, else the environment
(``--kek-file`` → ``LETHE_KEK_FILE``), else a TOML config file (``--config``
or ``LETHE_CONFIG``; key ``kek_file``, top level or a command's table), else
its default, which ``--help`` shows (``server._settings``).

Output: with ``--json`` a command prints one JSON document on stdout (its
schema in the README) and nothing else there; logs, notes and progress bars
go to stderr, bars only on a terminal and never with ``--quiet``.

Exit status (:data:`EXIT_OK` …): 0 success; 1 a failed check (``audit``,
``probe``, ``demo``) or no such token to revoke; 2 usage, configuration or
resource error, as one line on stderr naming the flag, variable, config key,
path or address; 130 interrupted.

``lethe token`` works on the data directory of a running server (tokens are
read on every call): a new token works at once, a revoked or expired one is
refused within a second, open streams included.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from lethe.probe import add_probe_arguments
from server._auth import LABEL_RE, new_token, token_digest
from server._names import ID_RE
from server._settings import CONFIG_ENV, SettingsError, apply_settings
from server.store import (
    Store,
    StoreLockedError,
    TokenRow,
    acquire_lock,
    data_paths,
    open_store_for,
)
from shredder import (
    BACKUP_STAGES,
    RESTORE_STAGES,
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


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
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


def _owner(value: str) -> str:
    if not ID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError("owner ids match [a-z0-9][a-z0-9-]{0,62}")
    return value


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default: the value in force (the
    environment's or the config file's, when one sets it), ``on``/``off`` for a
    switch; an option without a default says in its own help what happens
    without it. A bearer token's value is never shown."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or "%(default)" in text or action.default is None:
            return text + (" (required)" if action.required else "")
        if action.default is argparse.SUPPRESS:
            return text
        if action.nargs == 0:
            return f"{text} (default: {'on' if action.default else 'off'})"
        if "--token" in action.option_strings:
            return f"{text} (default: set, not shown)"
        return f"{text} (default: %(default)s)"


_EPILOG = (
    "Every --some-flag can also be set by the environment variable LETHE_SOME_FLAG or the "
    "key some_flag of the --config file (top level, or this command's table); the command "
    "line wins, then the environment, then the file. Exit status: 0 success; 1 a check "
    "failed (audit, probe, demo) or no such token; 2 usage, configuration or resource error "
    "(one line on stderr naming it); 130 interrupted."
)
_DATA_HELP = "the data directory (LMDB data environment and keystore)"
_KEK_HELP = (
    "the KEK file (default: the one `lethe serve` created at first start, "
    "~/.config/lethe/keks/<store-id>.kek; the LETHE_KEK variable holds an in-memory KEK instead)"
)


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    *,
    data: bool = True,
    json_help: str | None = None,
    progress: bool = False,
) -> argparse.ArgumentParser:
    """A sub-command with the flags most commands share: ``--config``,
    ``--data``, ``--kek-file``, ``--json`` (when ``json_help`` says what it
    prints) and ``--quiet`` (when it shows progress)."""
    parser = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=_EPILOG,
        formatter_class=_HelpFormatter,
    )
    _add_config(parser)
    if data:
        parser.add_argument(
            "--data", type=Path, default="./lethe-data", metavar="DIR", help=_DATA_HELP
        )
        parser.add_argument("--kek-file", type=Path, default=None, metavar="FILE", help=_KEK_HELP)
    if json_help is not None:
        parser.add_argument(
            "--json",
            action="store_true",
            help=f"print one JSON document on stdout: {json_help}",
        )
    if progress:
        parser.add_argument(
            "--quiet",
            action="store_true",
            help="no progress bar on stderr (there is none anyway when stderr is not a terminal)",
        )
    return parser


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"a TOML file of settings (default: ${CONFIG_ENV}, else none); command line > "
        "environment > config file > default",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lethe",
        description="Lethe memory store. `lethe COMMAND --help` shows a command's flags "
        "and their defaults.",
        epilog=_EPILOG,
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _command(
        sub,
        "serve",
        "serve the gRPC API",
        json_help="where it serves, once listening ({listen, port, metrics_listen, data, kek})",
    )
    serve.add_argument(
        "--listen", type=_address, default="127.0.0.1:50051", help="HOST:PORT for gRPC"
    )
    serve.add_argument(
        "--metrics-listen",
        type=_address_or_off,
        default="127.0.0.1:9464",
        help="HOST:PORT for /metrics, or 'off'",
    )
    serve.add_argument(
        "--embedder",
        choices=["wordllama", "none"],
        default="wordllama",
        help="the dense embedder ('none': lexical search only)",
    )
    serve.add_argument(
        "--pending-ttl",
        type=parse_duration,
        default="72h",
        help="a PENDING turn or memory expires this long after it was written",
    )
    serve.add_argument(
        "--sweep-interval",
        type=parse_duration,
        default="5s",
        help="run the sweeper (expiry, audits, rotation when due) this often",
    )
    serve.add_argument(
        "--rotation-interval",
        type=parse_duration,
        default="1h",
        help="complete shreds cryptographically this often",
    )
    serve.add_argument(
        "--index-cache-size",
        type=parse_size,
        default="4GiB",
        help="bytes of in-memory search indexes kept (estimated); past it the least recently "
        "searched owners' indexes are dropped and rebuilt from the store on their next search",
    )
    serve.add_argument(
        "--max-store-size",
        type=parse_size,
        default="64GiB",
        help="the data environment grows on demand up to this size; a write that does not "
        "fit is refused whole with STORE_FULL (units B, KiB, MiB, GiB, TiB)",
    )
    serve.add_argument(
        "--tagger",
        choices=["rules", "none"],
        default="rules",
        help="propose candidate memories for untagged turns",
    )
    bounds = serve.add_argument_group(
        "concurrency", "past a bound a call is refused at once with RESOURCE_EXHAUSTED"
    )
    bounds.add_argument(
        "--workers", type=_positive_int, default=16, help="threads for blocking work"
    )
    bounds.add_argument(
        "--max-inflight", type=_positive_int, default=64, help="unary calls at once, in all"
    )
    bounds.add_argument(
        "--max-inflight-per-principal",
        type=_positive_int,
        default=16,
        help="unary calls at once per token",
    )
    bounds.add_argument(
        "--max-running-per-principal",
        type=_positive_int,
        default=4,
        help="of those, calls of one token running at once",
    )
    bounds.add_argument(
        "--max-streams", type=_positive_int, default=1024, help="open Watch streams, in all"
    )
    bounds.add_argument(
        "--max-streams-per-principal",
        type=_positive_int,
        default=128,
        help="open Watch streams per token",
    )
    transport = serve.add_argument_group("transport")
    transport.add_argument(
        "--tls-cert", type=Path, default=None, help="PEM certificate chain (default: plaintext)"
    )
    transport.add_argument(
        "--tls-key", type=Path, default=None, help="PEM private key (default: plaintext)"
    )
    transport.add_argument(
        "--client-ca",
        type=Path,
        default=None,
        help="PEM CAs of client certificates: clients must present one (mutual TLS; "
        "default: no client certificates asked)",
    )
    transport.add_argument(
        "--max-receive-message-size",
        type=parse_message_size,
        default="16MiB",
        help="largest request message accepted",
    )
    transport.add_argument(
        "--max-send-message-size",
        type=parse_message_size,
        default="16MiB",
        help="largest response message sent",
    )
    transport.add_argument(
        "--keepalive-min-interval",
        type=parse_duration,
        default="10s",
        help="accept client keepalive pings this far apart or more",
    )
    transport.add_argument(
        "--keepalive-time",
        type=parse_duration,
        default="60s",
        help="ping an idle connection this often",
    )
    transport.add_argument(
        "--keepalive-timeout",
        type=parse_duration,
        default="20s",
        help="drop a connection whose ping is unanswered this long",
    )
    transport.add_argument(
        "--drain-grace",
        type=parse_duration,
        default="30s",
        help="on SIGTERM, time given to calls in flight",
    )

    token = sub.add_parser(
        "token", help="create, list and revoke bearer tokens", formatter_class=_HelpFormatter
    )
    token_sub = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = _command(
        token_sub,
        "create",
        "print a new bearer token",
        json_help="{token, id, owners, admin, label, expire_time}",
    )
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--owner",
        type=_owner,
        action="append",
        dest="owners",
        help="an owner id it may act for (repeat for more; command line only)",
    )
    who.add_argument(
        "--admin", action="store_true", help="acts for every owner (command line only)"
    )
    create.add_argument(
        "--label",
        type=_label,
        default=None,
        help="a name for it, stored in plaintext: no content (default: none)",
    )
    create.add_argument(
        "--expires-in",
        type=parse_duration,
        default=None,
        help="refuse it after this, e.g. 30d (default: never expires)",
    )
    _command(
        token_sub,
        "list",
        "list tokens (ids, never secrets)",
        json_help="{tokens: [{id, state, create_time, expire_time, label, admin, owners}]}",
    )
    revoke = _command(
        token_sub,
        "revoke",
        "revoke a token by id (takes effect within 1 s)",
        json_help="{id, revoke_time}",
    )
    revoke.add_argument("id", help="the token's id, as `lethe token list` shows it")

    backup = _command(
        sub,
        "backup",
        "consistent compacted copy of the data environment (safe while serving)",
        json_help="{out, bytes, sha256, store_id, create_time}",
        progress=True,
    )
    backup.add_argument(
        "--out", type=Path, required=True, help="a new or empty directory outside --data"
    )

    _command(
        sub,
        "rotate",
        "complete pending shreds now: new ring and KEK keys (server stopped)",
        json_help="{rings_renewed, ring_keys_rewrapped, kek_versions_destroyed}",
        progress=True,
    )

    _command(
        sub,
        "audit",
        "print the audit counts of every owner; exit 1 if any count is non-zero",
        json_help="{healthy, totals, owners: {owner: counts}} (unhealthy owners only)",
    )

    restore = _command(
        sub,
        "restore",
        "restore a data backup beside the keystore (server stopped)",
        json_help="{backup, data, forgotten, deletions_resumed, kept_without_key}",
        progress=True,
    )
    restore.add_argument(
        "--backup", type=Path, required=True, help="a directory `lethe backup` wrote"
    )

    demo = _command(
        sub,
        "demo",
        "ingest LoCoMo, measure recall, forget, back up, restore",
        json_help="the report --out gets (stage lines then go to stderr)",
        progress=True,
    )
    source = demo.add_mutually_exclusive_group()
    source.add_argument(
        "--locomo",
        type=Path,
        default=None,
        help="path of locomo10.json; one that does not exist fails with exit status 2 "
        "(default: ../shared/data/locomo/locomo10.json if it exists, else the sample)",
    )
    source.add_argument(
        "--sample",
        action="store_true",
        help="run on the short sample conversation instead of LoCoMo",
    )
    demo.add_argument(
        "--out", type=Path, default="demo-results.json", help="the JSON file the figures go to"
    )
    demo.add_argument(
        "--conversations",
        type=_non_negative_int,
        default=0,
        help="use only the first N conversations (0 = all)",
    )

    probe = _command(
        sub,
        "probe",
        "plant-and-delete probe against a running server",
        data=False,
        json_help="{passed, cycles, stages: [{cycle, stage, status, detail}], seconds}",
    )
    add_probe_arguments(probe)
    return parser


def _emit(document: dict[str, Any]) -> None:
    """Print ``document`` as the one JSON document of a ``--json`` run (stdout)."""
    print(json.dumps(document, indent=2, sort_keys=True), flush=True)


def _rfc3339(seconds: float) -> str | None:
    """Seconds since the epoch → ``2026-12-01T13:52:01Z``; None for 0 (never)."""
    return _when(seconds) if seconds else None


class _Stages:
    """A tqdm bar on stderr over the named stages of one command.

    Off with ``--quiet``, and whenever stderr is not a terminal (tqdm's
    ``disable=None``), so scripts and logs get no bar.
    """

    def __init__(self, desc: str, stages: Sequence[str], quiet: bool) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=len(stages),
            desc=desc,
            unit="step",
            file=sys.stderr,
            disable=True if quiet else None,
            leave=False,
        )
        self._started = False

    def __call__(self, stage: str) -> None:
        """Mark the previous stage done and ``stage`` started."""
        if self._started:
            self._bar.update(1)
        self._started = True
        self._bar.set_postfix_str(stage)

    def close(self) -> None:
        """Mark the last stage done and remove the bar."""
        if self._started:
            self._bar.update(1)
        self._bar.close()


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
    host = args.listen.rpartition(":")[0]
    kek = server.store.kek.path
    if args.json:
        _emit(
            {
                "listen": f"{host}:{port}",
                "port": port,
                "metrics_listen": config.metrics_listen,
                "data": str(args.data.resolve()),
                "kek": str(kek) if kek is not None else None,
            }
        )
    else:
        print(f"lethe serving {args.data.resolve()} on {host}:{port}", flush=True)
        print(_kek_line(kek, args.data), flush=True)
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


def _no_store(data: Path) -> EnvironmentConfigError:
    return EnvironmentConfigError(
        f"{data} holds no lethe store; start `lethe serve --data {data}` once "
        "first, or pass the data directory the server uses"
    )


def _token_store(args: argparse.Namespace) -> Store:
    if Keystore.read_store_id(data_paths(args.data.resolve())[1]) is None:
        raise _no_store(args.data)
    return Store(args.data, kek_file=args.kek_file, lock=False)


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)) if seconds else "-"


def _token_state(row: TokenRow, now: float) -> str:
    return "revoked" if row.revoke_time else "active" if row.active(now) else "expired"


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
            if args.json:
                _emit(
                    {
                        "token": token,
                        "id": row.id,
                        "owners": list(row.owners),
                        "admin": row.admin,
                        "label": row.label or None,
                        "expire_time": _rfc3339(row.expire_time),
                    }
                )
            else:
                print(token)
            print(f"lethe: token {row.id} created; expires {_when(expire)}", file=sys.stderr)
            return 0
        if args.action == "list":
            now = time.time()
            rows = store.tokens()
            if args.json:
                _emit(
                    {
                        "tokens": [
                            {
                                "id": row.id,
                                "state": _token_state(row, now),
                                "create_time": _rfc3339(row.create_time),
                                "expire_time": _rfc3339(row.expire_time),
                                "revoke_time": _rfc3339(row.revoke_time),
                                "label": row.label or None,
                                "admin": row.admin,
                                "owners": list(row.owners),
                            }
                            for row in rows
                        ]
                    }
                )
                return 0
            print(f"{'id':<16}  {'state':<8}  {'created':<20}  {'expires':<20}  label  acts for")
            for row in rows:
                who = "admin" if row.admin else ",".join(row.owners)
                print(
                    f"{row.id:<16}  {_token_state(row, now):<8}  {_when(row.create_time):<20}  "
                    f"{_when(row.expire_time):<20}  {row.label or '-'}  {who}"
                )
            return 0
        revoked = store.revoke_token(args.id)
        if revoked is None:
            print(f"lethe: no token has id {args.id!r} (see `lethe token list`)", file=sys.stderr)
            return 1
        if args.json:
            _emit({"id": revoked.id, "revoke_time": _rfc3339(revoked.revoke_time)})
        else:
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
        raise _no_store(args.data)
    kek = _kek_path(args.data, args.kek_file)
    if kek is not None:
        check_kek_placement(kek, [args.out])
    if args.out.resolve().is_relative_to(args.data.resolve()):
        raise EnvironmentConfigError(
            f"the backup directory {args.out} must be outside the data directory {args.data}"
        )
    stages = _Stages("backup", BACKUP_STAGES, args.quiet)
    try:
        live = open_store_for(args.data)
        manifest = backup_environment(
            data_env,
            args.out,
            store_id,
            env=live.env if live is not None else None,
            progress=stages,
        )
    finally:
        stages.close()
    if args.json:
        _emit(
            {
                "out": str(args.out.resolve()),
                "bytes": manifest.bytes,
                "sha256": manifest.sha256,
                "store_id": manifest.store_id,
                "create_time": _rfc3339(manifest.created_time),
            }
        )
        return 0
    print(
        f"backup of {args.data} written to {args.out} ({manifest.bytes} bytes, "
        f"sha256 {manifest.sha256[:16]}…); keystore and KEK not included"
    )
    return 0


def _rotate(args: argparse.Namespace) -> int:
    """Rotate with the server stopped: a running server holds the KEK in memory
    and rotates itself every ``--rotation-interval``."""
    if Keystore.read_store_id(data_paths(args.data.resolve())[1]) is None:
        raise _no_store(args.data)
    stages = _Stages("rotate", ("open the store", "rotate rings and KEK", "close"), args.quiet)
    try:
        stages("open the store")
        try:
            store = Store(args.data, kek_file=args.kek_file)
        except StoreLockedError:
            raise StoreLockedError(
                f"{args.data} is served by a running lethe; it rotates every "
                "--rotation-interval (stop it to rotate now)"
            ) from None
        try:
            stages("rotate rings and KEK")
            renewed, rewrapped, retired = store.rotate()
        finally:
            stages("close")
            store.close()
    finally:
        stages.close()
    if args.json:
        _emit(
            {
                "rings_renewed": renewed,
                "ring_keys_rewrapped": rewrapped,
                "kek_versions_destroyed": retired,
            }
        )
        return 0
    print(
        f"rotated: {renewed} rings renewed, {rewrapped} ring keys moved to a new KEK version, "
        f"KEK versions {retired} destroyed"
    )
    return 0


OFFLINE_UNMEASURED = ("index_drift",)
"""Audit counts ``lethe audit`` cannot measure: the indexes live in the serving
process (``Lifecycle.Audit`` counts index drift there)."""


def _audit(args: argparse.Namespace) -> int:
    """Audit every owner from this process (safe beside a running server: reads
    only). Index drift is not printed: only ``Lifecycle.Audit`` on the server,
    which holds the indexes, can count it."""
    from dataclasses import asdict

    from server.store import AuditCounts

    if Keystore.read_store_id(data_paths(args.data.resolve())[1]) is None:
        raise _no_store(args.data)
    store = Store(args.data, kek_file=args.kek_file, lock=False)

    def measured(counts: AuditCounts) -> dict[str, int]:
        return {k: v for k, v in asdict(counts).items() if k not in OFFLINE_UNMEASURED}

    total = AuditCounts()
    unhealthy: dict[str, dict[str, int]] = {}
    try:
        for owner in store.owners():
            counts = store.audit(owner)
            for key, value in asdict(counts).items():
                setattr(total, key, getattr(total, key) + value)
            if not counts.healthy():
                unhealthy[owner] = measured(counts)
    finally:
        store.close()
    if args.json:
        _emit(
            {
                "healthy": total.healthy(),
                "totals": measured(total),
                "owners": unhealthy,
                "not_measured": list(OFFLINE_UNMEASURED),
            }
        )
    else:
        for owner, counts_of in unhealthy.items():
            print(f"owners/{owner}: {counts_of}")
        for key, value in measured(total).items():
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
    if not args.backup.is_dir():
        raise EnvironmentConfigError(f"backup directory {args.backup} does not exist")
    stages = _Stages("restore", (*RESTORE_STAGES, "recover"), args.quiet)
    try:
        fd = acquire_lock(args.data.resolve())
        try:
            restore_environment(args.backup, data_env, store_id, progress=stages)
        finally:
            os.close(fd)
        stages("recover")
        store = Store(args.data, kek_file=args.kek_file)
        try:
            lifecycle = Lifecycle(store, Retriever(store, load_embedder("none")), Metrics())
            failpoint(FP_RESTORE_AFTER_REPLACE)
            recovery = lifecycle.recover()
        finally:
            store.close()
    finally:
        stages.close()
    kept = len(recovery.kept_without_key)
    if args.json:
        _emit(
            {
                "backup": str(args.backup.resolve()),
                "data": str(args.data.resolve()),
                "forgotten": recovery.forgotten,
                "deletions_resumed": recovery.deletions_resumed,
                "kept_without_key": kept,
            }
        )
        return 0
    print(
        f"restored {args.backup} into {args.data}: {recovery.forgotten} turns and memories "
        f"whose keys were destroyed since the backup are forgotten; "
        f"{recovery.deletions_resumed} deletions resumed"
        + (f"; {kept} records without a key kept (see the log, lethe audit)" if kept else "")
    )
    return 0


EXIT_OK = 0
"""The command did what it was asked."""
EXIT_FAILED = 1
"""A check failed (``audit``, ``probe``, ``demo``), or ``token revoke`` found no such token."""
EXIT_USAGE = 2
"""Usage, configuration or resource error: one line on stderr names the flag,
variable, file, path or address."""
EXIT_INTERRUPTED = 130
"""Interrupted (SIGINT, Ctrl-C) before the command finished; ``serve`` instead
stops gracefully on SIGINT and exits 0."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lethe`` console script.

    Args:
        argv: the arguments (default ``sys.argv[1:]``); settings not on it come
            from the environment, then the config file (``server._settings``).

    Returns:
        The exit status: :data:`EXIT_OK`, :data:`EXIT_FAILED`,
        :data:`EXIT_USAGE` or :data:`EXIT_INTERRUPTED` (argparse itself exits
        with 2 on a malformed command line).
    """
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    words = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        apply_settings(parser, words, os.environ)
    except SettingsError as exc:
        print(f"lethe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(words)
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
        if args.command == "probe":
            from lethe.probe import run_probe

            return run_probe(args)
    except KeyboardInterrupt:
        print(f"lethe {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (EnvironmentConfigError, StoreLockedError, ShredderError, OSError) as exc:
        print(f"lethe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
