"""Moving an owner between two shards while a client writes to it, in one run.

Two ``lethe serve`` processes (``--embedder none``, each with its own data
directory and KEK file) on loopback. Shard a holds the moved owner — one
thread of ``--turns`` committed turns with client vectors (d=256), written in
batches of 1000 — and ``--others`` owners of 100 turns that stay. While one
client appends single turns to the moved owner (following ``OWNER_MOVED`` to
the destination, retrying ``OWNER_MOVING``), ``lethe owner move`` moves it to
shard c. Reported per size: the move's wall time, how long writes were
refused (from the export's marker to activation), the longest gap between two
acknowledged writes as the client saw it, writes acknowledged during the
move, rows and keys moved, and a check that every acknowledged write is on c
once and in order.

Usage::

    .venv/bin/python bench/bench_move.py [--turns 1000,10000] [--others 5] [--out move.json]

The machine is shared and noisy: the figures are single runs.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from _server import free_port

import lethe.client as lc

LETHE = [sys.executable, "-m", "server.cli"]
DIM = 256


@contextlib.contextmanager
def _shard(work: Path, name: str) -> Iterator[dict[str, Any]]:
    """One ``lethe serve`` with a KEK file; yields ``{name, data, kek, address, env}``."""
    data, kek, port = work / f"data-{name}", work / f"kek-{name}", free_port()
    env = {k: v for k, v in os.environ.items() if k != "LETHE_KEK"} | {"LETHE_KEK_FILE": str(kek)}
    log = work / f"serve-{name}.log"  # its log apart: log lines come before the ready line
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [*LETHE, "serve", "--data", str(data), "--listen", f"127.0.0.1:{port}",
             "--embedder", "none", "--metrics-listen", "off"],
            env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "serving" not in line:
            proc.kill()
            raise RuntimeError(f"lethe serve did not start: {line}{log.read_text()[-3000:]}")
        yield {"name": name, "data": data, "kek": kek, "address": f"127.0.0.1:{port}", "env": env}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


def _cli(shard: dict[str, Any], *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        [*LETHE, *args], env=shard["env"], input=stdin, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"lethe {' '.join(args)}: {done.stderr}")
    return done.stdout


def _fill(client: lc.Client, owner: str, turns: int, rng: np.random.Generator) -> str:
    thread = client.create_thread(f"owners/{owner}", thread_id="t1").name
    for start in range(0, turns, 1000):
        n = min(1000, turns - start)
        vectors = rng.standard_normal((n, DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        client.append_turns(
            thread,
            [
                {"role": "USER", "text": f"{owner} {start + i}", "embedding": vectors[i].tolist()}
                | {"commit": True}
                for i in range(n)
            ],
        )
    return thread


def _move_once(turns: int, others: int, rng: np.random.Generator) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="lethe-bench-move-"))
    with _shard(work, "a") as a, _shard(work, "c") as c:
        token = _cli(a, "token", "create", "--data", str(a["data"]), "--admin").strip()
        _cli(c, "shard", "token-import", "--data", str(c["data"]), "--admin", stdin=token + "\n")
        setup = lc.Client(a["address"], token, tls=False, timeout=120)
        owner = "moved"
        started = time.monotonic()
        thread = _fill(setup, owner, turns, rng)
        for i in range(others):
            _fill(setup, f"other-{i}", 100, rng)
        fill_seconds = time.monotonic() - started
        setup.close()
        acked: list[str] = []
        times: list[float] = []
        refused = 0
        stop = threading.Event()

        def write() -> None:
            nonlocal refused
            client, i = lc.Client(a["address"], token, tls=False, retry=None), 0
            while not stop.is_set():
                try:
                    client.append_turns(thread, [{"role": "USER", "text": f"w{i}", "commit": True}])
                except lc.OwnerMoving:
                    refused += 1
                    time.sleep(0.005)
                    continue
                except lc.OwnerMoved as exc:
                    client.close()
                    client = lc.Client(exc.target, token, tls=False, retry=None)
                    continue
                acked.append(f"w{i}")
                times.append(time.monotonic())
                i += 1
            client.close()

        writer = threading.Thread(target=write)
        writer.start()
        try:
            while len(acked) < 50:
                time.sleep(0.01)
            before = len(acked)
            receipt = json.loads(
                _cli(a, "owner", "move", "--data", str(a["data"]), "--owner", owner, "--from", "a",
                     "--to", "c", "--target", c["address"], "--to-data", str(c["data"]),
                     "--to-kek-file", str(c["kek"]), "--json")
            )  # fmt: skip
            during = len(acked) - before
            mark = len(acked)
            while len(acked) < mark + 50:
                time.sleep(0.01)
        finally:
            stop.set()
            writer.join(60)
        check = lc.Client(c["address"], token, tls=False, timeout=120)
        on_c = [t.text for t in check.iter_turns(thread) if t.text.startswith("w")]
        check.close()
        gaps = [t2 - t1 for t1, t2 in itertools.pairwise(times)]
        return {
            "turns": turns,
            "other_owners": others,
            "fill_seconds": round(fill_seconds, 2),
            "move_seconds": receipt["seconds"],
            "writes_refused_seconds": receipt["writes_refused_seconds"],
            "steps_seconds": receipt["steps_seconds"],
            "longest_write_gap_seconds": round(max(gaps), 3),
            "writes_acknowledged_during_move": during,
            "refusals_retried": refused,
            "rows_removed_at_source": sum(receipt["rows_removed"].values()),
            "keys_destroyed_at_source": receipt["keys_destroyed"],
            "every_acknowledged_write_on_destination": on_c == acked,
        }


def main() -> None:
    """Move an owner of each ``--turns`` size and print one Markdown table row per move.

    With ``--out``, the rows are also written as JSON.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="1000,10000", help="sizes of the moved owner")
    parser.add_argument("--others", type=int, default=5, help="owners of 100 turns that stay")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    rng = np.random.default_rng(7)
    rows = []
    print("| turns | move s | writes refused s | longest write gap s | writes during", end="")
    print(" | rows | keys | all on c |\n|---|---|---|---|---|---|---|---|")
    for turns in (int(t) for t in args.turns.split(",")):
        row = _move_once(turns, args.others, rng)
        rows.append(row)
        print(
            f"| {turns} | {row['move_seconds']:.3f} | {row['writes_refused_seconds']:.3f} | "
            f"{row['longest_write_gap_seconds']:.3f} | {row['writes_acknowledged_during_move']} | "
            f"{row['rows_removed_at_source']} | {row['keys_destroyed_at_source']} | "
            f"{row['every_acknowledged_write_on_destination']} |",
            flush=True,
        )
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
