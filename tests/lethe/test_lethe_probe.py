"""``lethe probe`` (:mod:`lethe.probe`) against the real server over a real channel.

Run in-process through ``server.cli.main`` as a user would run it.
"""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Lethe

from lethe import probe as _probe
from lethe.probe import STAGES, add_probe_arguments, summarise
from lethe.v1 import common_pb2
from server.cli import main, parse_duration

CYCLES = 3
_LINE = re.compile(r"cycle (\d+) ([a-z-]+): (.*)")


def _stage_lines(out: str) -> list[tuple[int, str, str]]:
    return [
        (int(m.group(1)), m.group(2), m.group(3))
        for m in (_LINE.fullmatch(line) for line in out.splitlines())
        if m
    ]


def test_probe_cycles_pass_on_a_healthy_server(
    lethe: Lethe, capsys: pytest.CaptureFixture[str]
) -> None:
    token = lethe.token("lethe-probe")
    rc = main(
        ["probe", "--target", f"127.0.0.1:{lethe.port}", "--token", token, "--cycles", str(CYCLES)]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    expected = [(n, stage, "ok") for n in range(1, CYCLES + 1) for stage in STAGES]
    assert _stage_lines(out) == expected, out
    assert f"probe: {CYCLES} cycles ok" in out


def test_probe_leaves_nothing_of_its_own_behind(
    lethe: Lethe, capsys: pytest.CaptureFixture[str]
) -> None:
    from lethe.v1 import memories_pb2, threads_pb2

    token = lethe.token("lethe-probe")
    assert main(["probe", "--target", f"127.0.0.1:{lethe.port}", "--token", token]) == 0
    capsys.readouterr()
    c = lethe.client(token=token)
    threads = c.threads.ListThreads(
        threads_pb2.ListThreadsRequest(parent="owners/lethe-probe"), metadata=tuple(c.md)
    )
    memories = c.memories.ListMemories(
        memories_pb2.ListMemoriesRequest(parent="owners/lethe-probe"), metadata=tuple(c.md)
    )
    assert (list(threads.threads), list(memories.memories)) == ([], [])


def test_probe_with_bad_token_exits_2(lethe: Lethe, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["probe", "--target", f"127.0.0.1:{lethe.port}", "--token", "not-a-token"])
    captured = capsys.readouterr()
    assert rc == 2
    assert "UNAUTHENTICATED/INVALID_TOKEN" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert _stage_lines(captured.out) == []


def test_probe_with_token_for_another_owner_exits_2(
    lethe: Lethe, capsys: pytest.CaptureFixture[str]
) -> None:
    token = lethe.token("alice")
    rc = main(["probe", "--target", f"127.0.0.1:{lethe.port}", "--token", token])
    assert rc == 2
    assert "PERMISSION_DENIED/OWNER_NOT_ALLOWED" in capsys.readouterr().err


def test_probe_without_a_server_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        rc = main(["probe", "--target", f"127.0.0.1:{port}", "--token", "t"])
    assert rc == 2
    assert "cannot connect" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30.0), ("2.5", 2.5), ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5)],
)
def test_interval_takes_seconds_or_a_duration(text: str, seconds: float) -> None:
    parser = argparse.ArgumentParser()
    add_probe_arguments(parser)
    args = parser.parse_args(["--target", "h:1", "--token", "t", "--interval", text])
    assert args.interval == seconds


@pytest.mark.parametrize("text", ["0", "-1", "0s", "1x", "1h 2m", "h", ""])
def test_interval_rejects_zero_negative_and_malformed(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        _probe._seconds(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("72h", 259200.0), ("30m", 1800.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1d", 86400.0)],
)
def test_one_duration_grammar_for_the_probe_and_the_server(text: str, seconds: float) -> None:
    """The probe holds the grammar (it imports no server module); ``lethe serve`` uses it."""
    assert parse_duration is _probe.parse_duration
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "72", "1x", "h", ""])
def test_a_bad_duration_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_summariser_is_deterministic() -> None:
    assert summarise(["a", "b"]) == summarise(["a", "b"]) == "summary: a | b"


def test_probe_reports_a_leak_when_the_forget_does_nothing(
    lethe: Lethe, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injected on the probe's side: the planted turn is never forgotten."""

    def forget_nothing(self: _probe._Cycle, f: object) -> None:
        assert self.planted is not None
        assert self.fact is not None
        assert self.summary is not None
        self.forgotten = {self.planted.name, self.fact.name, self.summary.name}
        self.receipt = common_pb2.DeletionReceipt()

    monkeypatch.setattr(_probe._Cycle, "forget", forget_nothing)
    token = lethe.token("lethe-probe")
    rc = main(["probe", "--target", f"127.0.0.1:{lethe.port}", "--token", token, "--cycles", "2"])
    out = capsys.readouterr().out
    assert rc == 1, out
    lines = _stage_lines(out)
    assert [(n, stage) for n, stage, _ in lines] == [
        (1, "plant"),
        (1, "forget"),
        (1, "before-rebuild"),
        (1, "cleanup"),
    ]
    assert lines[2][2].startswith("LEAK: ")
    assert "holding the planted value" in lines[2][2]
    assert lines[3][2] == "ok"
    assert out.splitlines()[-1] == "probe: LEAK or failure in cycle 1, stage before-rebuild"


def test_probe_reports_a_leak_when_a_rebuild_source_holds_the_value(
    lethe: Lethe, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injected on the probe's side: an offered source reads as the planted text."""
    monkeypatch.setattr(
        _probe._Cycle, "_read_offered", lambda self, ref: (self.planted_text, False)
    )
    token = lethe.token("lethe-probe")
    rc = main(["probe", "--target", f"127.0.0.1:{lethe.port}", "--token", token])
    out = capsys.readouterr().out
    assert rc == 1, out
    failed = {stage: text for _, stage, text in _stage_lines(out) if text != "ok"}
    assert list(failed) == ["after-rebuild"], out
    assert failed["after-rebuild"].startswith("LEAK: offered source")


def test_probe_passes_without_an_embedder(
    lethe_at: Callable[..., Lethe], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DENSE search is not served without an embedder: the probe says so and passes."""
    server = lethe_at(tmp_path / "data", embedder="none")
    token = server.token("lethe-probe")
    rc = main(["probe", "--target", f"127.0.0.1:{server.port}", "--token", token])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "DENSE not served: the server has no embedder" in out.splitlines()[-1]


def test_probe_reports_a_leak_when_forget_ignores_echoes(
    lethe: Lethe, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injected on the probe's side: every forget asks for declared lineage only."""
    from lethe.client import Client

    real = Client.forget

    def lineage_only(self: Client, *args: object, **kw: object) -> common_pb2.DeletionReceipt:
        kw.update(echoes="IGNORE", echo_guard=0)
        return real(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Client, "forget", lineage_only)
    token = lethe.token("lethe-probe")
    rc = main(["probe", "--target", f"127.0.0.1:{lethe.port}", "--token", token])
    out = capsys.readouterr().out
    assert rc == 1, out
    failed = {stage: text for _, stage, text in _stage_lines(out) if text != "ok"}
    assert list(failed) == ["echoes"], out
    assert "echo sweep did not find the repetition" in failed["echoes"]
    assert "holding the forgotten fact" in failed["echoes"]  # the repetition is still served


def test_probe_counts_echoes_and_guard_hits(
    lethe: Lethe, capsys: pytest.CaptureFixture[str]
) -> None:
    token = lethe.token("lethe-probe")
    rc = main(["probe", "--target", f"127.0.0.1:{lethe.port}", "--token", token, "--cycles", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "echoes found 2, acted on 2, guard hits 2, guards set 2" in out.splitlines()[-1]
