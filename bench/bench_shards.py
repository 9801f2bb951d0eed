"""The latency nginx adds over a direct call, in one run.

One ``lethe serve`` (its own process, ``--embedder none
--require-owner-header``) and, in front of it, nginx with the config ``lethe
shard nginx-config`` writes for a one-shard ring. The same typed client calls
``GetThread`` (a small read: what routing costs shows, not what storage costs)
directly and through nginx, interleaved call by call (direct, proxied, direct,
…) so that both see the same machine load; after a warm-up, it reports p50 and
p99 of each and the ratio of the medians (proxied / direct) and their
difference (the microseconds nginx adds per call on loopback).

Usage::

    .venv/bin/python bench/bench_shards.py [--calls 2000] [--out bench-shards.json]

Needs nginx (``scripts/install_nginx.sh``). The machine is shared and noisy:
compare the ratio within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from _server import free_port, served

from lethe.client import Client


def _nginx_binary() -> str:
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(found).exists():
        raise SystemExit("nginx is not installed (as root: bash scripts/install_nginx.sh)")
    return found


@contextlib.contextmanager
def _nginx(shard: str) -> Iterator[int]:
    """Run nginx in front of ``shard`` (``HOST:PORT``) on a free port; yields the port.

    Raises:
        SystemExit: nginx is not installed, or exited or did not listen within 20 s.
    """
    work = Path(tempfile.mkdtemp(prefix="lethe-bench-nginx-"))
    port = free_port()
    include = work / "lethe.conf"
    command = [sys.executable, "-m", "server.cli", "shard", "nginx-config", "--shards"]
    subprocess.run(
        [*command, f"a={shard}", "--listen", f"127.0.0.1:{port}", "--out", str(include)],
        check=True,
        capture_output=True,
    )
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (work / sub).mkdir()
    user = "user root;\n" if os.geteuid() == 0 else ""
    temp = "".join(
        f"    {s}_temp_path {work}/{s};\n" for s in ("proxy", "fastcgi", "uwsgi", "scgi")
    )
    conf = work / "nginx.conf"
    conf.write_text(
        f"{user}worker_processes 1;\ndaemon off;\npid {work}/nginx.pid;\n"
        f"error_log {work}/error.log warn;\nevents {{ worker_connections 1024; }}\n"
        f"http {{\n    access_log off;\n    client_body_temp_path {work}/body;\n{temp}"
        f"    include {include};\n}}\n"
    )
    nginx = _nginx_binary()
    log = ["-e", str(work / "error.log")]
    proc = subprocess.Popen([nginx, "-p", str(work), "-c", str(conf), *log])
    try:
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as s:
                try:
                    s.connect(("127.0.0.1", port))
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit((work / "error.log").read_text()) from None
            time.sleep(0.05)
        yield port
    finally:
        proc.send_signal(signal.SIGQUIT)
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    """Time ``GetThread`` directly and through nginx, print and write to ``--out`` (JSON).

    Raises:
        SystemExit: nginx is not installed, or exited or did not listen within 20 s.
        RuntimeError: ``lethe serve`` did not report that it is serving.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls each way (2000)")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("bench-shards.json"))
    args = parser.parse_args()
    with served("--embedder", "none", "--metrics-listen", "off", "--require-owner-header") as (
        port,
        token,
    ):
        shard = f"127.0.0.1:{port}"
        with _nginx(shard) as proxy_port:
            direct = Client(shard, token, tls=False, retry=None)
            proxied = Client(f"127.0.0.1:{proxy_port}", token, tls=False, retry=None)
            thread = direct.create_thread("owners/bench", thread_id="t1").name
            times: dict[str, list[float]] = {"direct": [], "nginx": []}
            for i in range(args.warmup + args.calls):
                for label, client in (("direct", direct), ("nginx", proxied)):
                    start = time.perf_counter()
                    client.get_thread(thread)
                    elapsed = time.perf_counter() - start
                    if i >= args.warmup:
                        times[label].append(elapsed)
            direct.close()
            proxied.close()
    p50 = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "calls_each": args.calls,
        "method": "Threads.GetThread",
        "direct_p50_ms": round(p50["direct"] * 1e3, 3),
        "direct_p99_ms": round(_pct(times["direct"], 0.99) * 1e3, 3),
        "nginx_p50_ms": round(p50["nginx"] * 1e3, 3),
        "nginx_p99_ms": round(_pct(times["nginx"], 0.99) * 1e3, 3),
        "added_p50_us": round((p50["nginx"] - p50["direct"]) * 1e6, 1),
        "ratio_p50": round(p50["nginx"] / p50["direct"], 3),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for key, value in result.items():
        print(f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
