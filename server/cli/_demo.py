"""``lethe demo``: its flags; the demo itself is a client of the API (:mod:`lethe.demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from server.cli._common import Subcommands, command, non_negative_int


def add(sub: Subcommands) -> None:
    """Add ``lethe demo`` and its flags to ``sub``."""
    demo = command(
        sub,
        "demo",
        "ingest LoCoMo, measure recall, forget, back up, restore",
        json_help="the report --out gets (stage lines then go to stderr)",
        progress=True,
    )
    demo.set_defaults(run=run)
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
        help="run on the short sample conversation instead of LoCoMo (command line only)",
    )
    demo.add_argument(
        "--out", type=Path, default="demo-results.json", help="the JSON file the figures go to"
    )
    demo.add_argument(
        "--conversations",
        type=non_negative_int,
        default=0,
        help="use only the first N conversations (0 = all)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo (:func:`lethe.demo.run_demo`); returns its exit status."""
    from lethe.demo import run_demo

    return run_demo(args)
