"""What an owner's turns cost a ``ListMemories`` in creation order (``order_by="create_time"``).

A listing in creation order scans the owner's ``owner_records`` rows, where
turns and memories both live, and skips each turn with one ``memories`` read.
Starts ``lethe serve`` in its own process (``--embedder none``: storage is
measured, not embedding), gives one owner ``--memories`` memories and then
``--turns`` turns, and times a listing of the memories with one page of 1000
in id order (which never sees a turn) and in creation order (which crosses
every turn); the difference over the turns is the skip's cost per turn::

    .venv/bin/python bench/bench_list_skip.py [--turns 20000] [--memories 10]

Prints the medians (ms) of ``--repeat`` listings each way and the cost per
turn (µs). The machine is shared and noisy: a single run's figure.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _server import served

from lethe.client import Client

OWNER = "owners/bench"


def _median_ms(client: Client, order_by: str, repeat: int) -> tuple[float, int]:
    """Median milliseconds of one 1000-memory page ``order_by``, and how many it listed."""
    took, listed = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        page = client.list_memories(OWNER, order_by=order_by, page_size=1000)
        took.append(time.perf_counter() - started)
        listed = len(page.memories)
    return statistics.median(took) * 1e3, listed


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print it (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--memories", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args(argv)
    with served("--metrics-listen", "off", "--embedder", "none") as (port, token):
        client = Client(f"127.0.0.1:{port}", token)
        for i in range(args.memories):
            memory = {"kind": "FACT", "text": f"fact {i}", "state": "COMMITTED"}
            client.create_memory(OWNER, memory)
        thread = client.create_thread(OWNER, thread_id="t").name
        for lo in range(0, args.turns, 1000):
            n = min(1000, args.turns - lo)
            client.append_turns(
                thread, [{"role": "USER", "text": f"turn {lo + j}"} for j in range(n)]
            )
        by_id, n_id = _median_ms(client, "name", args.repeat)
        by_creation, n_creation = _median_ms(client, "create_time", args.repeat)
        client.close()
    assert n_id == n_creation == args.memories, (n_id, n_creation)
    per_turn = (by_creation - by_id) / args.turns * 1e3
    print(
        f"{args.memories} memories after {args.turns} turns, one page: by id "
        f"{by_id:.2f} ms, by creation {by_creation:.2f} ms; "
        f"skipping a turn costs {per_turn:.2f} µs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
