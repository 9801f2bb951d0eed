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
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from server._auth import new_token, token_digest
from server._cli_parser import build_parser, parse_duration, parse_message_size, parse_size
from server._owner_moves import run_owner_command
from server._settings import SettingsError, apply_settings
from server._shards import run_shard_command
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

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "main",
    "parse_duration",
    "parse_message_size",
    "parse_size",
]

FP_RESTORE_AFTER_REPLACE = declare(
    "restore.after_replace",
    "lethe restore replaced the data environment; start-up recovery has not run",
)


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


GC_THRESHOLDS = (20_000, 50, 100)
"""``gc.set_threshold`` of a serving process (CPython's default is 700, 10, 10).
An index build or a 1,000-turn append allocates millions of short-lived,
acyclic objects (freed by reference counting) beside millions of long-lived
ones in the indexes; at the default thresholds the collector ran ~600 times
and took 12% of a 20k-turn build's CPU (0.65 of 5.2 s), at these 17 times and
0.1 s. Cyclic garbage waits longer to be found; nothing else changes."""


def _serve(args: argparse.Namespace) -> int:
    import gc

    from server._app import LetheServer, ServerConfig

    gc.set_threshold(*GC_THRESHOLDS)

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
    # Before the ready line: a supervisor may send SIGTERM the moment it reads it.
    stopped = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        print(f"lethe: signal {signum}, shutting down", file=sys.stderr, flush=True)
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
    parser = build_parser()
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
        if args.command == "shard":
            return run_shard_command(args, lambda: _token_store(args))
        if args.command == "owner":
            return run_owner_command(args, lambda: _token_store(args))
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
