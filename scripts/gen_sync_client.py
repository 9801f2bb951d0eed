"""Generate the blocking client ``lethe.client.Client`` from the asyncio one (unasync).

Usage: ``python scripts/gen_sync_client.py [--check] [--out DIR]``.

The asyncio client is the source: each module of :data:`SOURCES`
(``lethe/client/_async.py``, ``_base_async.py``, ``_threads_async.py`` …) is
turned into its blocking twin (``_sync.py``, ``_base_sync.py``,
``_threads_sync.py`` …) by the token rules of :data:`RULES`, applied line by
line, then the one block rule :data:`YIELD_LOOP`; the result is normalised by
the project's pinned ruff (imports sorted, then formatted: the rules shorten
lines and rename imported names) and gets a header that says it is generated.
The model is encode/httpcore's ``scripts/unasync.py``.

What no rule covers lives in the two hand-written flavour modules
``lethe/client/_transport_async.py`` and ``_transport_sync.py``, which define
the same names (the channel, the unary call, what an event stream waits on);
a source imports ``_transport_async`` and its twin ``_transport_sync``. A
generated module that still holds an asyncio word (``async``, ``await``,
``asyncio``, ``aio``, ``Async…``) is refused, so a source cannot leak one.

Without options it writes the generated modules into ``lethe/client/``; with
``--out DIR``, under ``DIR/lethe/client/`` instead. Writing removes a generated
module whose source is gone. With ``--check`` it writes nothing, compares with
the files under the output directory, prints a diff of each stale one and
exits 1 (a generated module whose source is gone is stale too).
``tests/test_generated_code.py`` regenerates into a temporary directory and
fails on any difference.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path("lethe") / "client"
"""The client package, relative to the repository root (and to ``--out``)."""

SOURCES = (
    "_async",
    "_base_async",
    "_threads_async",
    "_memories_async",
    "_retrieval_async",
    "_lifecycle_async",
    "_repairs_async",
    "_events_async",
)
"""The asyncio modules of ``lethe/client/`` that the blocking client is generated from."""

HEADER = (
    "# Generated from lethe/client/{source} by scripts/gen_sync_client.py: do not edit.\n"
    "# Edit the source and run `.venv/bin/python scripts/gen_sync_client.py`.\n"
)
"""The first lines of every generated module (``{source}``: the source file's name)."""
HEADER_PREFIX = "# Generated from lethe/client/"

RULES: tuple[tuple[str, str], ...] = (
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    # AsyncClient, AsyncEventStream, AsyncIterator, AsyncClientBase, ...
    (r"\bAsync([A-Z]\w*)", r"\1"),
    # lethe.client._async, lethe.client._threads_async, _transport_async, ...
    (r"_async\b", "_sync"),
)
"""Token rules, ``(pattern, replacement)`` for :func:`re.sub`, applied in order to each line."""

YIELD_LOOP = re.compile(
    r"^(?P<indent>[ ]*)for (?P<item>\w+) in (?P<items>.+):\n"
    r"(?P=indent)    yield (?P=item)\n"
    r"(?!(?P=indent)(    \S|else:))",
    re.MULTILINE,
)
"""A loop whose only statement yields its item (an async generator cannot
``yield from``), which becomes ``yield from`` (ruff's UP028)."""

LEFTOVER = re.compile(r"\basync\b|\bawait\b|asyncio|\baio\b|\bAsync")
"""An asyncio word no generated module may hold."""

_COMPILED = tuple((re.compile(pattern), replacement) for pattern, replacement in RULES)


def target_name(source: str) -> str:
    """The generated module's stem for a source's stem (``_threads_async`` → ``_threads_sync``)."""
    return re.sub(r"_async$", "_sync", source)


def unasync_line(line: str) -> str:
    """One line with every rule of :data:`RULES` applied, in order."""
    for pattern, replacement in _COMPILED:
        line = pattern.sub(replacement, line)
    return line


def _ruff(args: list[str], text: str, filename: str) -> str:
    """``text`` through ``ruff <args>`` as if it were ``filename`` (the project's settings).

    Raises:
        SystemExit: ruff failed or is not installed (it comes with the dev extras).
    """
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--stdin-filename", filename, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {args[0]} failed on {filename}:\n{done.stderr}{done.stdout}")
    return done.stdout


def generate(source: str) -> str:
    """The blocking module generated from ``lethe/client/{source}.py``.

    Raises:
        SystemExit: the result still holds an asyncio word (:data:`LEFTOVER`),
            or ruff failed.
    """
    text = (ROOT / PACKAGE / f"{source}.py").read_text()
    text = "".join(unasync_line(line) for line in text.splitlines(keepends=True))
    text = YIELD_LOOP.sub(r"\g<indent>yield from \g<items>\n", text)
    left = [
        f"  {n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), start=1)
        if LEFTOVER.search(line)
    ]
    if left:
        raise SystemExit(
            f"lethe/client/{source}.py: no rule covers these lines (generated):\n"
            + "\n".join(left)
            + "\nrewrite them for both flavours, or move them to the _transport modules"
        )
    text = HEADER.format(source=f"{source}.py") + text
    filename = str(PACKAGE / f"{target_name(source)}.py")
    text = _ruff(["check", "--fix", "--select", "I", "--quiet"], text, filename)
    return _ruff(["format", "--quiet"], text, filename)


def _orphans(folder: Path) -> list[Path]:
    """Generated modules under ``folder`` whose source is not in :data:`SOURCES`."""
    expected = {f"{target_name(s)}.py" for s in SOURCES}
    return sorted(
        p
        for p in folder.glob("*.py")
        if p.name not in expected and p.read_text().startswith(HEADER_PREFIX)
    )


def main() -> int:
    """Generate, or with ``--check`` compare; the exit status (1: stale files)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write or compare under")
    args = parser.parse_args()
    folder = args.out / PACKAGE
    stale: list[str] = []
    for source in SOURCES:
        fresh = generate(source)
        path = folder / f"{target_name(source)}.py"
        if not args.check:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(fresh)
            continue
        current = path.read_text() if path.is_file() else ""
        if current != fresh:
            stale.append(str(path))
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(keepends=True),
                    fresh.splitlines(keepends=True),
                    f"{path} (committed)",
                    f"{path} (generated)",
                )
            )
    for orphan in _orphans(folder):
        if args.check:
            stale.append(f"{orphan} (its source is gone)")
        else:
            orphan.unlink()
    if stale:
        print("stale generated modules (run scripts/gen_sync_client.py):", *stale, sep="\n  ")
        return 1
    if not args.check:
        print(f"wrote {len(SOURCES)} modules under {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
