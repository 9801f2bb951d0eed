"""``lethe receipt public-key | verify | rotate-key``: the keys that sign deletion receipts.

Every deletion receipt a server returns is signed with an Ed25519 key of its
store (:mod:`lethe.receipts`). ``public-key`` prints the public keys (every key
the store ever signed with, retired ones included), from a running server
(``--target``, ``Lifecycle.GetServerInfo``) or from the data directory;
``verify`` checks receipt files offline with only those public keys;
``rotate-key`` replaces the signing key, with the server stopped: the old
public key stays published, so receipts it signed keep verifying, and its
private half is destroyed (completed cryptographically by the next
rotation of the KEK, ``lethe rotate``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from server.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    HelpFormatter,
    Subcommands,
    add_remote,
    command,
    emit,
    has_store,
    no_store,
    open_beside,
    run_remote,
)


def add(sub: Subcommands) -> None:
    """Add ``lethe receipt public-key | verify | rotate-key`` and their flags to ``sub``."""
    receipt = sub.add_parser(
        "receipt",
        help="the keys that sign deletion receipts: print them, verify receipts, rotate the key",
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    receipt.set_defaults(run=run)
    actions = receipt.add_subparsers(dest="action", required=True, metavar="ACTION")
    public = command(
        actions,
        "public-key",
        "print the public keys that verify the store's receipts (retired ones too)",
        json_help="{store_id, keys: [{key_id, public_key (base64), create_time, retire_time}]}",
    )
    add_remote(public, required=False)
    verify = command(
        actions,
        "verify",
        "check signed receipts offline with the store's public keys; exit 1 if any fails",
        data=False,
        json_help="{verified, receipts: [{file, name, store_id, key_id, valid, why}]}",
    )
    verify.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="receipt files: JSON (a receipt, `lethe forget --json` output, a list) or "
        "JSON Lines (`lethe export`)",
    )
    verify.add_argument(
        "--public-key",
        action="append",
        dest="public_keys",
        required=True,
        metavar="KEY",
        help="a base64 public key, or a file (`lethe receipt public-key --json` output, or "
        "base64 keys one per line); repeat for more",
    )
    command(
        actions,
        "rotate-key",
        "replace the signing key (server stopped); the old public key stays published",
        json_help="{key_id, retired_key_id}",
    )


def run(args: argparse.Namespace) -> int:
    """Run ``lethe receipt ACTION``.

    Returns:
        :data:`EXIT_OK`; :data:`EXIT_FAILED` when ``verify`` finds a receipt that
        does not verify; :data:`EXIT_USAGE` for an unreadable file or key, or a
        server that cannot be reached.

    Raises:
        EnvironmentConfigError: ``--data`` holds no store.
        StoreLockedError: ``rotate-key`` while a server serves ``--data``.
    """
    if args.action == "verify":
        return _verify(args)
    if args.action == "rotate-key":
        return _rotate_key(args)
    if args.target:
        return run_remote(args, lambda client: _print_keys(args, client.get_server_info()))
    store = open_beside(args)
    try:
        info = store.server_info()
    finally:
        store.close()
    return _print_keys(args, info)


def _print_keys(args: argparse.Namespace, info: Any) -> int:
    from lethe.remote import server_info_document

    doc = server_info_document(info)
    if args.json:
        emit(doc)
        return EXIT_OK
    print(f"store {doc['store_id']}")
    for key in doc["keys"]:
        state = f"retired {key['retire_time']}" if key["retire_time"] else "current"
        print(f"{key['key_id']}  {key['public_key']}  created {key['create_time']}  {state}")
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from lethe.remote import verify_files

    texts = []
    for value in args.public_keys:
        path = Path(value)
        try:
            texts.append(path.read_text() if path.is_file() else value)
        except OSError as exc:
            print(f"lethe receipt verify: --public-key {value}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        doc = verify_files(args.files, texts)
    except ImportError:
        print(
            "lethe receipt verify: PyNaCl is needed to verify (pip install pynacl)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except (OSError, ValueError) as exc:
        print(f"lethe receipt verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        emit(doc)
    else:
        for item in doc["receipts"]:
            said = "ok" if item["valid"] else f"INVALID: {item['why']}"
            print(f"{item['file']}: {item['name'] or '(unnamed)'}: {said}")
    return EXIT_OK if doc["verified"] else EXIT_FAILED


def _rotate_key(args: argparse.Namespace) -> int:
    from server.store import Store, StoreLockedError

    if not has_store(args.data):
        raise no_store(args.data)
    try:
        store = Store(args.data, kek_file=args.kek_file)
    except StoreLockedError:
        raise StoreLockedError(
            f"{args.data} is served by a running lethe: stop it to rotate the signing key"
        ) from None
    try:
        new, old = store.keystore.rotate_signing_key()
    finally:
        store.close()
    if args.json:
        emit({"key_id": new, "retired_key_id": old})
    else:
        print(
            f"signing key {new} is current; {old or 'no key'} retired (its public key stays "
            "published; `lethe rotate` destroys its private key in every copy now, the "
            "server's next rotation otherwise)"
        )
    return EXIT_OK
