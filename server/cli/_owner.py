r"""``lethe owner …``: move an owner from one shard to another.

Each command runs beside the running server of its ``--data`` directory (LMDB
lets several processes share an environment; the server sees each marker on
the next call) and is safe to repeat after a crash (see
:mod:`server.store._moves` for the steps and what each leaves behind)::

    # on the destination's machine: a receive key (its private half stays there)
    lethe owner receive-key --out c.receive-key          # prints the public half
    # on the source's: refuse alice's writes, copy her, sealed to that key
    lethe owner export --data A --owner alice --to c --target 10.0.0.3:50051 \
        --recipient PUBLIC_HEX --out alice.lethe-owner
    # on the destination's: hold her, refused to calls until activated
    lethe owner import --data C --in alice.lethe-owner --receive-key c.receive-key --from a
    # point the proxy at c (lethe shard nginx-config --placement alice=c; nginx -s reload)
    lethe owner activate --data C --owner alice
    lethe owner release --data A --owner alice           # OWNER_MOVED, keys shredded

Or, when both data directories are on one machine, ``lethe owner move`` runs
the same steps in one process (the receive key then exists only in its
memory), runs ``--flip`` (the command that points the proxy at the
destination) between import and activation, and resumes where a crash left
off when run again.

``lethe owner abort`` undoes a move before its release; ``lethe owner status``
prints an owner's marker and row counts. Exit status 0, or 1 when the step
does not apply to the owner's state here (the message says why), 2 for bad
arguments or an unreadable file.

Thread rules: a command runs on the main thread of its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from server.cli._common import (
    EXIT_FAILED,
    EXIT_USAGE,
    Subcommands,
    address,
    open_beside,
    owner_id,
)
from shredder import IntegrityError, ReceiveKey

_EXIT_REFUSED = EXIT_FAILED
"""The step does not apply to the owner's state here (the message says why)."""


def add(sub: Subcommands) -> None:
    """Add ``lethe owner`` and its actions to ``sub``.

    The actions: ``receive-key``, ``export``, ``import``, ``move``, ``activate``,
    ``release``, ``abort`` and ``status``.
    """
    parser = sub.add_parser("owner", help="move an owner between shards (export, import, release)")
    parser.set_defaults(run=run)
    actions = parser.add_subparsers(dest="action", required=True)

    def action(name: str, help_text: str, *, data: bool = True) -> argparse.ArgumentParser:
        command: argparse.ArgumentParser = actions.add_parser(
            name, help=help_text, description=help_text
        )
        if data:
            command.add_argument("--data", type=Path, default=Path("./lethe-data"))
            command.add_argument("--kek-file", type=Path, default=None)
        command.add_argument(
            "--json", action="store_true", help="print one JSON document on stdout"
        )
        return command

    key = action(
        "receive-key", "make a destination's receive key (prints its public half)", data=False
    )
    key.add_argument("--out", type=Path, required=True, help="the private key file (mode 0600)")

    export = action("export", "refuse OWNER's writes here, then copy it sealed to a receive key")
    export.add_argument("--owner", type=owner_id, required=True)
    export.add_argument("--to", type=owner_id, required=True, help="the destination shard's name")
    export.add_argument("--target", type=address, default=None, help="its HOST:PORT")
    export.add_argument("--recipient", required=True, help="its receive key's public half (hex)")
    export.add_argument("--out", type=Path, required=True, help="the export file to write")

    imported = action("import", "hold an exported owner here, refused to calls until activated")
    imported.add_argument("--in", dest="source_file", type=Path, required=True)
    imported.add_argument("--receive-key", type=Path, required=True)
    imported.add_argument(
        "--from", dest="source", type=owner_id, required=True, help="source shard"
    )

    move = action("move", "all of the above in one process, for two data directories here")
    move.add_argument("--owner", type=owner_id, required=True)
    move.add_argument("--from", dest="source", type=owner_id, required=True, help="source shard")
    move.add_argument("--to", type=owner_id, required=True, help="the destination shard's name")
    move.add_argument("--target", type=address, default=None, help="its HOST:PORT")
    move.add_argument("--to-data", type=Path, required=True, help="the destination's data dir")
    move.add_argument("--to-kek-file", type=Path, default=None)
    move.add_argument(
        "--flip", default="", help="shell command run after the import, before activation"
    )

    for name, text in (
        ("activate", "serve an imported owner here (after the proxy routes it here)"),
        ("release", "answer OWNER_MOVED here, shred the owner's keys and remove its rows"),
        ("abort", "undo a move before its release (on the source or the destination)"),
        ("status", "print the owner's marker and row counts here"),
    ):
        action(name, text).add_argument("--owner", type=owner_id, required=True)


def run(args: argparse.Namespace) -> int:
    """Run ``lethe owner ACTION``; returns the exit status.

    Raises:
        EnvironmentConfigError: ``--data`` holds no store.
    """
    from server.store import MoveRefused, OwnerExport

    if args.action == "receive-key":
        receive = ReceiveKey.generate()
        try:
            receive.save(args.out)
        except FileExistsError:
            print(f"lethe: {args.out} exists; a receive key is never overwritten", file=sys.stderr)
            return EXIT_USAGE
        return _report(
            args,
            {"public": receive.public_hex, "file": str(args.out)},
            f"receive key written to {args.out}; its public half:\n{receive.public_hex}",
        )
    export: OwnerExport | None = None
    receive_key: ReceiveKey | None = None
    if args.action == "import":
        try:
            export = OwnerExport.decode(args.source_file.read_bytes())
            receive_key = ReceiveKey.load(args.receive_key)
        except (OSError, IntegrityError) as exc:
            print(f"lethe: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.action == "move":
        return _move(args)
    store = open_beside(args)
    try:
        return _run(args, store, export, receive_key)
    except MoveRefused as exc:
        print(f"lethe owner {args.action}: {exc.message}", file=sys.stderr)
        return _EXIT_REFUSED
    except (IntegrityError, ValueError) as exc:
        print(f"lethe owner {args.action}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        store.close()


def _run(args: argparse.Namespace, store: Any, export: Any, receive_key: ReceiveKey | None) -> int:
    if args.action == "export":
        started = time.monotonic()
        before = store.moved(args.owner)
        done = store.export_owner(args.owner, args.to, args.target or "", args.recipient)
        try:
            _write_atomically(args.out, done.encode())
        except OSError:
            if before is None or before.state != "moving":
                store.clear_moved(args.owner)  # this export's marker: writes go on
            raise
        doc = {
            "owner": args.owner,
            "move_id": done.marker.move_id,
            "rows": done.rows,
            "keys": done.key_count,
            "file": str(args.out),
            "bytes": args.out.stat().st_size,
            "seconds": round(time.monotonic() - started, 3),
        }
        return _report(
            args,
            doc,
            f"owners/{args.owner}: writes refused here; {sum(done.rows.values())} "
            f"rows and {done.key_count} keys sealed to {args.out}",
        )
    if args.action == "import":
        started = time.monotonic()
        marker = store.import_owner(export, receive_key, args.source)
        doc = {
            "owner": marker.owner,
            "move_id": marker.move_id,
            "rows": export.rows,
            "keys": export.key_count,
            "seconds": round(time.monotonic() - started, 3),
        }
        return _report(
            args,
            doc,
            f"owners/{marker.owner} imported (refused to calls until "
            f"`lethe owner activate`): {sum(export.rows.values())} rows, {export.key_count} keys",
        )
    if args.action == "activate":
        marker = store.activate_move(args.owner)
        return _report(
            args,
            {"owner": marker.owner, "move_id": marker.move_id, "state": marker.state},
            f"owners/{marker.owner} served here",
        )
    if args.action == "release":
        marker = store.moved(args.owner)
        shard, target = (marker.shard, marker.target) if marker is not None else ("", "")
        receipt = _released(store, store.release_owner(args.owner, shard, target))
        return _report(args, receipt, json.dumps(receipt, indent=2, sort_keys=True))
    if args.action == "abort":
        said = store.abort_move(args.owner)
        return _report(args, {"owner": args.owner, "done": said}, said)
    marker = store.moved(args.owner)
    counts = store.owner_row_counts(args.owner)
    held = "served" if store.holds_owner(args.owner) else "not held"
    doc = {
        "owner": args.owner,
        "state": held if marker is None else marker.state,
        "shard": "" if marker is None else marker.shard,
        "move_id": "" if marker is None else marker.move_id,
        "rows": counts,
    }
    return _report(
        args,
        doc,
        f"owners/{args.owner}\t{doc['state']}\t{doc['shard'] or '-'}\t{sum(counts.values())} rows",
    )


def _move(args: argparse.Namespace) -> int:
    """``lethe owner move``: export, import, flip, activate, release in one process."""
    from server.store import KEK_ENV, MoveRefused, Store, data_paths
    from shredder import Keystore

    if os.environ.get(KEK_ENV):
        print(
            f"lethe owner move: {KEK_ENV} would give both stores one KEK; "
            "pass --kek-file and --to-kek-file (or run the steps one by one)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.to_data.resolve() == args.data.resolve():
        print("lethe owner move: --to-data is the source's own --data", file=sys.stderr)
        return EXIT_USAGE
    if Keystore.read_store_id(data_paths(args.to_data.resolve())[1]) is None:
        # Never create one: the owner would move into a store no server serves.
        print(
            f"lethe owner move: --to-data {args.to_data} holds no lethe store; pass the "
            "data directory the destination's server uses",
            file=sys.stderr,
        )
        return EXIT_USAGE
    source = open_beside(args)
    try:
        dest = Store(args.to_data, kek_file=args.to_kek_file, lock=False)
    except BaseException:
        source.close()
        raise
    try:
        if not dest.keystore.kek_opens_rings():
            print(
                f"lethe owner move: the KEK given for {args.to_data} (--to-kek-file or its "
                "default path) does not open its keys; nothing was moved",
                file=sys.stderr,
            )
            return EXIT_USAGE
        doc = _move_steps(args, source, dest)
    except MoveRefused as exc:
        print(f"lethe owner move: {exc.message}", file=sys.stderr)
        return _EXIT_REFUSED
    except subprocess.CalledProcessError as exc:
        print(
            f"lethe owner move: --flip exited {exc.returncode}; run the move again", file=sys.stderr
        )
        return _EXIT_REFUSED
    finally:
        dest.close()
        source.close()
    return _report(args, doc, json.dumps(doc, indent=2, sort_keys=True))


def _move_steps(args: argparse.Namespace, source: Any, dest: Any) -> dict[str, Any]:
    """Run the steps of a move that have not happened yet (see :mod:`server.store._moves`).

    Returns the receipt with the times of the cut-over.
    """
    owner = args.owner
    started = time.monotonic()
    steps: dict[str, float] = {}

    def step(name: str, since: float) -> float:
        now = time.monotonic()
        steps[name] = round(now - since, 3)
        return now

    left, arrived = source.moved(owner), dest.moved(owner)
    same = left is not None and arrived is not None and left.move_id == arrived.move_id
    refused_since = at = started
    if not (same and (left.state == "moved" or arrived.state == "arrived")):
        receive = ReceiveKey.generate()
        refused_since = time.monotonic()  # the export's first act is the marker
        export = source.export_owner(owner, args.to, args.target or "", receive.public_hex)
        at = step("export", at)
        dest.import_owner(export, receive, args.source)
        at = step("import", at)
        if args.flip:
            # The operator's own command line, as `--flip` documents: a shell is the point.
            subprocess.run(args.flip, shell=True, check=True)  # noqa: S602
            at = step("flip", at)
    if dest.moved(owner).state != "arrived":
        dest.activate_move(owner)
    activated = step("activate", at)
    receipt = _released(source, source.release_owner(owner, args.to, args.target or ""))
    step("release", activated)
    receipt["steps_seconds"] = steps
    receipt["writes_refused_seconds"] = round(activated - refused_since, 3)
    receipt["seconds"] = round(time.monotonic() - started, 3)
    return receipt


def _released(store: Any, move: Any) -> dict[str, Any]:
    """A release's document: what it destroyed, and ``receipt``, signed by the source's store.

    ``receipt`` is the release as a deletion receipt (``MoveReceipt.as_receipt``);
    ``lethe receipt verify`` checks it with the source's public keys.
    """
    from lethe.remote import message_document

    doc: dict[str, Any] = move.as_dict()
    doc["receipt"] = message_document(store.sign_receipt(move.as_receipt()))
    return doc


def _report(args: argparse.Namespace, doc: dict[str, Any], text: str) -> int:
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True), flush=True)
    else:
        print(text, flush=True)
    return 0


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a synced temporary file and a rename.

    A crash leaves the old file or the whole new one.
    """
    tmp = path.with_name(path.name + ".tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
