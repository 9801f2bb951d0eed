"""``lethe probe``: its flags; the probe itself is a client of the API (:mod:`lethe.probe`)."""

from __future__ import annotations

import argparse

from server.cli._common import Subcommands, command


def add(sub: Subcommands) -> None:
    """Add ``lethe probe`` and its flags (:func:`lethe.probe.add_probe_arguments`) to ``sub``."""
    from lethe.probe import add_probe_arguments

    probe = command(
        sub,
        "probe",
        "plant-and-delete probe against a running server",
        data=False,
        json_help="{passed, cycles, stages: [{cycle, stage, status, detail}], seconds}",
    )
    probe.set_defaults(run=run)
    add_probe_arguments(probe)


def run(args: argparse.Namespace) -> int:
    """Run the probe (:func:`lethe.probe.run_probe`); returns its exit status."""
    from lethe.probe import run_probe

    return run_probe(args)
