"""The ``lethe`` command line, run as a user would.

Subprocesses for ``serve`` (graceful SIGTERM), ``token create`` and refusals;
``demo`` in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from conftest import free_port as _free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lethe.v1 import threads_pb2, threads_pb2_grpc
from server.cli import main, parse_duration

LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo10.json"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("72h", 259200.0), ("30m", 1800.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1d", 86400.0)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "72", "h", "-1h", "0s", "1x", "1h 2m"])
def test_parse_duration_rejects_malformed(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


@pytest.mark.parametrize(
    "value", ["onnx:", "onnx:/no/such/model/dir", "minilm", "WordLlama", "onnx-x"]
)
def test_serve_rejects_an_unknown_embedder(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--embedder", value])
    assert exc.value.code == 2
    assert "--embedder" in capsys.readouterr().err


def test_serve_gil_switch_interval_defaults_to_one_ms_and_takes_ms() -> None:
    from server.cli import build_parser

    assert build_parser().parse_args(["serve"]).gil_switch_interval == 1.0
    args = ["serve", "--gil-switch-interval", "0.5"]
    assert build_parser().parse_args(args).gil_switch_interval == 0.5


@pytest.mark.parametrize("value", ["0", "0.05", "101", "-1", "1ms", "nan"])
def test_serve_rejects_a_switch_interval_out_of_range(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--gil-switch-interval", value])
    assert exc.value.code == 2
    assert "--gil-switch-interval" in capsys.readouterr().err


def test_serve_accepts_the_three_embedder_forms(tmp_path: Path) -> None:
    from server.cli import build_parser

    for value in ("wordllama", "none", f"onnx:{tmp_path}"):
        assert build_parser().parse_args(["serve", "--embedder", value]).embedder == value


def _lethe(*args: str, env: dict[str, str]) -> list[str]:
    return [sys.executable, "-m", "server.cli", *args]


LISTEN_ANY = ("--listen", "127.0.0.1:0", "--metrics-listen", "off")


def test_a_fresh_serve_says_nothing_before_its_serving_line(tmp_path: Path, kek_env: str) -> None:
    """Stdout and stderr together, as a supervisor reading one pipe sees them.

    FAISS's INFO lines about the CPU build it loads once came first, since
    FAISS is imported after logging is set up, and a script waiting for the
    serving line read them instead.
    """
    env = {**os.environ, "LETHE_KEK": kek_env}
    with subprocess.Popen(
        [*_lethe("serve", "--data", str(tmp_path / "d"), env=env), *LISTEN_ANY],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("lethe serving ")
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_serve_answers_health_and_tokens_then_stops_on_sigterm(
    tmp_path: Path, kek_env: str
) -> None:
    env = {**os.environ, "LETHE_KEK": kek_env}
    port = _free_port()
    data = tmp_path / "d"
    with subprocess.Popen(
        _lethe(
            "serve",
            "--data",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            "off",
            env=env,
        ),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert "serving" in proc.stdout.readline()
            assert proc.stdout.readline().startswith("lethe KEK in memory (LETHE_KEK)")
            token = subprocess.run(
                _lethe("token", "create", "--data", str(data), "--owner", "alice", env=env),
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            assert token.startswith("lethe_")
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
                assert health.status == health_pb2.HealthCheckResponse.SERVING
                thread = threads_pb2_grpc.ThreadsStub(ch).CreateThread(
                    threads_pb2.CreateThreadRequest(parent="owners/alice", thread_id="t1"),
                    metadata=(("authorization", f"Bearer {token}"),),
                )
                assert thread.name == "owners/alice/threads/t1"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_serve_refuses_kek_inside_data_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LETHE_KEK"}
    data = tmp_path / "d"
    result = subprocess.run(
        _lethe(
            "serve",
            "--data",
            str(data),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "off",
            "--kek-file",
            str(data / "kek.json"),
            env=env,
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "lethe:" in result.stderr
    assert not (data / "kek.json").exists()


def test_sigterm_the_moment_serve_says_it_is_ready_stops_it_cleanly(
    tmp_path: Path, kek_env: str
) -> None:
    """A supervisor may signal as soon as it reads the ready line: the handler is already installed.

    The handler is installed before that line is printed (it once came after,
    and a SIGTERM in between killed the server instead of draining it:
    exit -15).
    """
    env = {**os.environ, "LETHE_KEK": kek_env}
    codes = []
    for i in range(5):
        args = ["serve", "--data", str(tmp_path / f"d{i}"), "--listen", f"127.0.0.1:{_free_port()}"]
        with subprocess.Popen(
            [*_lethe(*args, "--embedder", "none", "--metrics-listen", "off", env=env)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith("lethe serving")
            proc.send_signal(signal.SIGTERM)
            codes.append(proc.wait(timeout=60))
    assert codes == [0] * 5


def test_backup_refuses_output_inside_data_directory(tmp_path: Path, kek_env: str) -> None:
    from server import Store

    Store(tmp_path / "d").close()
    assert main(["backup", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "d" / "b")]) == 2


def test_demo_on_sample_conversation_passes_its_checks(
    tmp_path: Path,
    kek_env: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``LETHE_JSON`` makes the report the demo's stdout.

    Its ``lethe`` children (token create, serve, backup, restore) do not
    inherit it.
    """
    monkeypatch.setenv("LETHE_JSON", "1")
    out = tmp_path / "demo.json"
    rc = main(["demo", "--data", str(tmp_path / "d"), "--sample", "--out", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0, report["failures"]
    printed = capsys.readouterr()
    assert json.loads(printed.out) == report
    assert "all forgetting checks passed" in printed.err
    assert report["source"] == "sample"
    assert report["failures"] == []
    assert report["forget"]["leaked_after_forget"] == 0
    assert report["forget"]["get_forgotten_turn_after_restore"] == "NOT_FOUND/RECORD_DELETED"
    assert report["kek"] == "in memory"  # LETHE_KEK; a KEK file is named by its path
    # The demo leaves no credential behind: its one token is labelled, expiring, revoked.
    monkeypatch.delenv("LETHE_JSON")
    listed = subprocess.run(
        _lethe("token", "list", "--json", "--data", str(tmp_path / "d"), env={}),
        env={**os.environ, "LETHE_KEK": kek_env},
        capture_output=True,
        text=True,
        check=True,
    )
    (token,) = json.loads(listed.stdout)["tokens"]
    assert token["id"] == report["token"]["id"]
    assert token["state"] == "revoked"
    assert token["label"].startswith("demo-")
    assert token["admin"] is True
    assert token["expire_time"] is not None


@pytest.mark.slow
@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo data not beside the repository")
def test_demo_on_two_locomo_conversations(tmp_path: Path, kek_env: str) -> None:
    out = tmp_path / "demo.json"
    rc = main(
        [
            "demo",
            "--data",
            str(tmp_path / "d"),
            "--locomo",
            str(LOCOMO),
            "--conversations",
            "2",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert rc == 0, report["failures"]
    assert report["turns"] == 419 + 369
    overall = report["recall"]["overall (1-4)"]
    assert overall["items"] > 200
    assert 0.0 < overall["recall@10"] <= overall["recall@20"] <= 1.0
    assert report["forget"]["plaintext_hits_backup"] == 0
    # a re-run on the same data directory starts from a clean slate
    assert (
        main(
            [
                "demo",
                "--data",
                str(tmp_path / "d"),
                "--locomo",
                str(LOCOMO),
                "--conversations",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["turns"] == 419


def test_audit_reports_a_healthy_store_and_exits_zero(
    tmp_path: Path, kek_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from server import Store

    store = Store(tmp_path / "d")
    store.create_thread("alice", "t1", "title")
    store.close()
    assert main(["audit", "--data", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "orphans: 0" in out
    assert "checked: 0" in out  # a thread without turns or memories


def test_audit_counts_a_key_without_record_and_exits_one(
    tmp_path: Path, kek_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from server import Store
    from shredder import RingRef

    store = Store(tmp_path / "d")
    store.create_thread("alice", "t1", "")
    store.keystore.create_record_keys([(RingRef("alice", "t1"), "stray-key")])
    store.close()
    assert main(["audit", "--data", str(tmp_path / "d")]) == 1
    assert "keys_without_record: 1" in capsys.readouterr().out


def test_serve_bounds_default_to_the_admission_limits() -> None:
    """The flags, ServerConfig and Limits say the same bounds (the flags once kept 64/16)."""
    from server._app import ServerConfig
    from server.cli import build_parser
    from server.edge import Limits

    args = build_parser().parse_args(["serve"])
    config, limits = ServerConfig(), Limits()
    assert (args.workers, config.max_workers, limits.workers) == (16, 16, 16)
    for name in (
        "max_running",
        "max_inflight",
        "max_inflight_per_principal",
        "max_running_per_principal",
        "max_streams",
        "max_streams_per_principal",
    ):
        assert getattr(args, name) == getattr(config, name) == getattr(limits, name), name
    assert (limits.max_inflight, limits.max_inflight_per_principal) == (1024, 256)


def test_a_serving_process_freezes_its_start_up_heap() -> None:
    """``freeze_heap`` leaves the collector's full passes only what was made since."""
    import gc

    from server.cli._serve import freeze_heap

    gc.unfreeze()
    try:
        frozen = freeze_heap()
        assert frozen == gc.get_freeze_count()
        assert frozen > 10_000  # this test process's modules and objects
        assert len(gc.get_objects(generation=2)) < frozen
    finally:
        gc.unfreeze()
