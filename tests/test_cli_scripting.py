"""The ``lethe`` command line as a script sees it.

As docs/operating.md, "The command line for scripts", describes it. Settings
from the command line, the environment and a TOML config file in that order;
refusals that name the variable, key, path or address; ``--json`` documents
alone on stdout; progress bars only on a terminal; ``--help`` showing every
option's default. Every command runs as a subprocess, as a script would run it,
on a real store.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

from server import Store

COMMANDS = [
    "serve",
    "token create",
    "token list",
    "token revoke",
    "backup",
    "rotate",
    "audit",
    "restore",
    "demo",
    "probe",
    "mcp",
    "forget",
    "export",
    "retention",
    "receipt public-key",
    "receipt verify",
    "receipt rotate-key",
]


_CLI = [sys.executable, "-m", "server.cli"]


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``LETHE_*`` setting, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")} | extra


def _run(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "server.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    """The one JSON document on stdout (the whole of stdout must parse)."""
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, Path]:
    """A store with a KEK file: (data directory, KEK file)."""
    data, kek = tmp_path / "d", tmp_path / "kek" / "lethe.kek"
    s = Store(data, kek_file=kek)
    s.create_thread("alice", "t1", "")
    s.close()
    return data, kek


# -- precedence ---------------------------------------------------------------


def test_backup_out_comes_from_flag_then_environment_then_table_then_top_level(
    tmp_path: Path, store: tuple[Path, Path]
) -> None:
    data, kek = store
    config = tmp_path / "lethe.toml"
    config.write_text(f'data = "{data}"\nkek_file = "{kek}"\nout = "{tmp_path / "top"}"\n')
    env = _env(LETHE_CONFIG=str(config))
    assert _run("backup", env=env).returncode == 0
    assert (tmp_path / "top" / "MANIFEST.json").exists()  # config file over "required"

    config.write_text(
        config.read_text() + f'[backup]\nout = "{tmp_path / "table"}"\n'
    )  # a command's table beats the top level
    assert _run("backup", env=env).returncode == 0
    assert (tmp_path / "table" / "MANIFEST.json").exists()

    env["LETHE_OUT"] = str(tmp_path / "env")  # environment over config file
    assert _run("backup", env=env).returncode == 0
    assert (tmp_path / "env" / "MANIFEST.json").exists()

    done = _run("backup", "--out", str(tmp_path / "flag"), "--json", env=env)
    assert _json(done)["out"] == str(tmp_path / "flag")  # command line over environment
    assert not (tmp_path / "env2").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if (p / "MANIFEST.json").exists()) == [
        "env",
        "flag",
        "table",
        "top",
    ]


def test_config_named_by_flag_beats_lethe_config(tmp_path: Path, store: tuple[Path, Path]) -> None:
    data, kek = store
    (tmp_path / "a.toml").write_text(f'data = "{data}"\nkek_file = "{kek}"\njson = true\n')
    (tmp_path / "b.toml").write_text(f'data = "{tmp_path / "nowhere"}"\n')
    env = _env(LETHE_CONFIG=str(tmp_path / "b.toml"))
    assert _run("audit", env=env).returncode == 2  # b.toml: no store there
    report = _json(_run("audit", "--config", str(tmp_path / "a.toml"), env=env))
    assert report["healthy"] is True


def _serve_document(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The JSON document ``lethe serve --json`` prints once listening (read from its stdout)."""
    assert proc.stdout is not None
    lines: list[str] = []
    while not lines or lines[-1] != "}\n":
        line = proc.stdout.readline()
        assert line, "lethe serve exited before printing its JSON document"
        lines.append(line)
    return dict(json.loads("".join(lines)))


def test_serve_takes_listen_from_config_and_metrics_off_from_environment(
    tmp_path: Path, kek_env: str
) -> None:
    port, metrics = free_port(), free_port()
    config = tmp_path / "lethe.toml"
    config.write_text(
        f'[serve]\nlisten = "127.0.0.1:{port}"\nmetrics_listen = "127.0.0.1:{metrics}"\n'
        'embedder = "none"\njson = true\n'
    )
    env = _env(LETHE_KEK=kek_env, LETHE_CONFIG=str(config), LETHE_METRICS_LISTEN="off")
    env["LETHE_DATA"] = str(tmp_path / "d")
    with subprocess.Popen(
        [sys.executable, "-m", "server.cli", "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            ready = _serve_document(proc)
            assert ready["listen"] == f"127.0.0.1:{port}"
            assert ready["port"] == port
            assert ready["metrics_listen"] is None
            assert ready["data"] == str(tmp_path / "d")
            assert ready["kek"] is None  # LETHE_KEK: in memory
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
            assert proc.stdout is not None
            assert proc.stdout.read() == ""  # nothing but the document on stdout
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_no_json_on_the_command_line_beats_lethe_json(store: tuple[Path, Path]) -> None:
    data, kek = store
    env = _env(LETHE_DATA=str(data), LETHE_KEK_FILE=str(kek), LETHE_JSON="yes")
    assert _json(_run("audit", env=env))["healthy"] is True
    plain = _run("audit", "--no-json", env=env)
    assert plain.returncode == 0
    assert plain.stdout.splitlines()[0] == "checked: 0"


def test_abbreviated_flags_are_refused(store: tuple[Path, Path], tmp_path: Path) -> None:
    """``--conf`` would be read by argparse but not by the config-file layer."""
    data, kek = store
    done = _run("audit", "--dat", str(data), "--kek-file", str(kek), env=_env())
    assert done.returncode == 2
    assert "unrecognized arguments: --dat" in done.stderr


def test_help_shows_the_default_in_force(tmp_path: Path) -> None:
    assert "(default: 72h)" in _run("serve", "--help", env=_env()).stdout
    assert "(default: 5m)" in _run("serve", "--help", env=_env(LETHE_PENDING_TTL="5m")).stdout
    config = tmp_path / "lethe.toml"
    config.write_text('pending_ttl = "2h"\n')
    shown = _run("serve", "--help", "--config", str(config), env=_env()).stdout
    assert "(default: 2h)" in shown


def test_token_authority_is_never_taken_from_environment(store: tuple[Path, Path]) -> None:
    data, kek = store
    env = _env(LETHE_DATA=str(data), LETHE_KEK_FILE=str(kek), LETHE_ADMIN="1")
    made = _json(_run("token", "create", "--owner", "alice", "--json", env=env))
    assert made["admin"] is False
    assert made["owners"] == ["alice"]
    refused = _run("token", "create", env=env | {"LETHE_OWNER": "alice"})
    assert refused.returncode == 2
    assert "--owner --admin" in refused.stderr or "one of the arguments" in refused.stderr


# -- refusals that name what is wrong ------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "command"),
    [
        ("LETHE_WORKERS", "many", "serve"),
        ("LETHE_PENDING_TTL", "3 days", "serve"),
        ("LETHE_EMBEDDER", "bert", "serve"),
        ("LETHE_JSON", "maybe", "audit"),
        ("LETHE_METRICS_LISTEN", "9464", "serve"),
    ],
)
def test_bad_environment_value_fails_naming_the_variable(
    tmp_path: Path, variable: str, value: str, command: str
) -> None:
    done = _run(*command.split(), env=_env(**{variable: value}), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"lethe: environment variable {variable}: ")
    assert done.stdout == ""
    assert not (tmp_path / "lethe-data").exists()  # refused before anything was opened


def test_bad_variable_of_another_command_does_not_stop_this_one(
    store: tuple[Path, Path],
) -> None:
    data, kek = store
    env = _env(LETHE_DATA=str(data), LETHE_KEK_FILE=str(kek), LETHE_WORKERS="many")
    assert _json(_run("audit", "--json", env=env))["healthy"] is True  # audit has no --workers
    assert "LETHE_WORKERS" in _run("serve", env=env).stderr


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("bogus = 1\n", "unknown key 'bogus'"),
        (
            "[serve]\nkek-file = 'x'\n",
            "unknown key 'kek-file' in [serve] (did you mean 'kek_file'?)",
        ),
        ("[backup]\nlisten = '127.0.0.1:1'\n", "unknown key 'listen' in [backup]"),
        ("[sever]\nlisten = '127.0.0.1:1'\n", "unknown table [sever]"),
        ("workers = 'many'\n", "lethe.toml: workers: expected a whole number"),
        ("json = 'yes please'\n", "lethe.toml: json: expected true or false"),
        ("[serve]\nworkers = true\n", "lethe.toml: [serve] workers: expected a string or a number"),
        ("data = \n", "is not TOML"),
    ],
)
def test_bad_config_file_fails_naming_the_file_and_key(
    tmp_path: Path, body: str, named: str
) -> None:
    config = tmp_path / "lethe.toml"
    config.write_text(body)
    done = _run("serve", "--config", str(config), env=_env(), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"lethe: config file {config}")
    assert named in done.stderr
    assert not (tmp_path / "lethe-data").exists()


def test_missing_config_file_fails_naming_it(tmp_path: Path) -> None:
    done = _run("audit", env=_env(LETHE_CONFIG=str(tmp_path / "absent.toml")))
    assert done.returncode == 2
    assert f"config file {tmp_path / 'absent.toml'}: No such file" in done.stderr


def test_busy_metrics_port_names_the_address(tmp_path: Path, kek_env: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        done = _run(
            "serve",
            "--data",
            str(tmp_path / "d"),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            address,
            "--embedder",
            "none",
            env=_env(LETHE_KEK=kek_env),
        )
    assert done.returncode == 2
    assert f"lethe: cannot serve /metrics on {address} (" in done.stderr
    assert "--metrics-listen" in done.stderr


def test_busy_grpc_port_names_the_address(tmp_path: Path, kek_env: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        done = _run(
            "serve",
            "--data",
            str(tmp_path / "d"),
            "--listen",
            address,
            "--metrics-listen",
            "off",
            "--embedder",
            "none",
            env=_env(LETHE_KEK=kek_env),
        )
    assert done.returncode == 2
    assert f"lethe: cannot listen on {address} (" in done.stderr


def test_demo_with_a_missing_locomo_path_exits_2_naming_it(tmp_path: Path) -> None:
    absent = tmp_path / "absent.json"
    done = _run("demo", "--data", str(tmp_path / "d"), "--locomo", str(absent), env=_env())
    assert done.returncode == 2
    assert done.stderr.strip().endswith(f"--locomo {absent}: no such file")
    assert not (tmp_path / "d").exists()  # no sample run instead
    sampled = _run(  # --sample is taken from the command line only
        "demo", "--locomo", str(absent), env=_env(LETHE_SAMPLE="1", LETHE_DATA=str(tmp_path))
    )
    assert sampled.returncode == 2
    assert f"--locomo {absent}: no such file" in sampled.stderr


def test_restore_of_a_missing_backup_names_it(tmp_path: Path, store: tuple[Path, Path]) -> None:
    data, kek = store
    env = _env(LETHE_DATA=str(data), LETHE_KEK_FILE=str(kek))
    done = _run("restore", "--backup", str(tmp_path / "nope"), env=env)
    assert done.returncode == 2
    assert f"backup directory {tmp_path / 'nope'} does not exist" in done.stderr


# -- --json, exit statuses, audit ------------------------------------------------


def test_json_documents_of_token_backup_rotate_restore_audit(
    tmp_path: Path, store: tuple[Path, Path]
) -> None:
    data, kek = store
    env = _env(LETHE_DATA=str(data), LETHE_KEK_FILE=str(kek), LETHE_JSON="true")
    made = _json(_run("token", "create", "--owner", "alice", "--label", "ci", env=env))
    assert made["token"].startswith("lethe_")
    assert re.fullmatch(r"[0-9a-f]{16}", made["id"])
    assert (made["label"], made["expire_time"], made["admin"]) == ("ci", None, False)
    timed = _json(_run("token", "create", "--admin", "--expires-in", "1d", env=env))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", timed["expire_time"])

    revoked = _json(_run("token", "revoke", made["id"], env=env))
    assert revoked["id"] == made["id"]
    assert revoked["revoke_time"] is not None
    listed = {t["id"]: t for t in _json(_run("token", "list", env=env))["tokens"]}
    assert listed[made["id"]]["state"] == "revoked"
    assert listed[timed["id"]] | {"create_time": None} == {
        "id": timed["id"],
        "state": "active",
        "create_time": None,
        "expire_time": timed["expire_time"],
        "revoke_time": None,
        "label": None,
        "admin": True,
        "owners": [],
    }
    missing = _run("token", "revoke", "0123456789abcdef", env=env)
    assert missing.returncode == 1
    assert missing.stdout == ""
    assert "no token has id '0123456789abcdef'" in missing.stderr

    backup = _json(_run("backup", "--out", str(tmp_path / "b"), env=env))
    assert backup["bytes"] == (tmp_path / "b" / "data.mdb").stat().st_size
    manifest = json.loads((tmp_path / "b" / "MANIFEST.json").read_text())
    assert (backup["sha256"], backup["store_id"]) == (manifest["sha256"], manifest["store_id"])

    rotated = _json(_run("rotate", env=env))
    assert set(rotated) == {"rings_renewed", "ring_keys_rewrapped", "kek_versions_destroyed"}
    assert rotated["kek_versions_destroyed"] == [1]
    assert rotated["ring_keys_rewrapped"] >= 1  # alice/t1's ring key

    restored = _json(_run("restore", "--backup", str(tmp_path / "b"), env=env))
    assert restored == {
        "backup": str(tmp_path / "b"),
        "data": str(data),
        "forgotten": 0,
        "deletions_resumed": 0,
        "kept_without_key": 0,
        "tokens": {"migrated": 0, "removed": [], "restored": [], "revoked": []},
    }

    audit = _json(_run("audit", env=env))
    assert audit["healthy"] is True
    assert audit["owners"] == {}
    assert audit["not_measured"] == ["index_drift"]
    assert "index_drift" not in audit["totals"]
    assert audit["totals"]["orphans"] == 0
    assert audit["stray_key_files"] == 0


def test_offline_audit_prints_no_index_drift(tmp_path: Path, store: tuple[Path, Path]) -> None:
    data, kek = store
    done = _run("audit", "--data", str(data), "--kek-file", str(kek), env=_env())
    assert done.returncode == 0
    assert "orphans: 0" in done.stdout
    assert "index_drift" not in done.stdout


def test_probe_takes_target_and_token_from_environment_and_prints_json(
    tmp_path: Path, kek_env: str
) -> None:
    port = free_port()
    env = _env(LETHE_KEK=kek_env, LETHE_DATA=str(tmp_path / "d"), LETHE_EMBEDDER="none")
    with subprocess.Popen(
        [*_CLI, "serve", "--listen", f"127.0.0.1:{port}", "--metrics-listen", "off"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            assert "serving" in proc.stdout.readline()
            token = _run("token", "create", "--owner", "lethe-probe", env=env).stdout.strip()
            probe_env = env | {"LETHE_TARGET": f"127.0.0.1:{port}", "LETHE_TOKEN": token}
            report = _json(_run("probe", "--json", env=probe_env))
            assert report["passed"] is True
            assert report["cycles"] == 1
            assert [s["stage"] for s in report["stages"]] == [
                "plant",
                "forget",
                "before-rebuild",
                "after-rebuild",
                "after-more-turns",
                "echoes",
                "cleanup",
            ]
            assert {s["status"] for s in report["stages"]} == {"ok"}
            refused = _run("probe", env=probe_env | {"LETHE_TOKEN": "lethe_wrong"})
            assert refused.returncode == 2
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


# -- progress ------------------------------------------------------------------


def _with_terminal_stderr(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``lethe ARGS`` with stderr on a pseudo-terminal: (status, stdout, terminal)."""
    leader, follower = pty.openpty()
    # a terminal of 24 rows and 100 columns (a fresh pty has 0 x 0: tqdm draws nothing)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    return proc.wait(timeout=60), out, seen.decode(errors="replace")


def test_backup_shows_progress_on_a_terminal_only_without_quiet(
    tmp_path: Path, store: tuple[Path, Path]
) -> None:
    data, kek = store
    env = _env(LETHE_DATA=str(data), LETHE_KEK_FILE=str(kek))
    rc, out, terminal = _with_terminal_stderr("backup", "--out", str(tmp_path / "b1"), env=env)
    assert rc == 0
    assert out.startswith("backup of ")
    assert "backup:" in terminal  # tqdm's bar, described by the command
    rc, out, terminal = _with_terminal_stderr(
        "backup", "--out", str(tmp_path / "b2"), "--quiet", "--json", env=env
    )
    assert rc == 0
    assert json.loads(out)["out"] == str(tmp_path / "b2")
    assert "backup:" not in terminal
    piped = _run("backup", "--out", str(tmp_path / "b3"), env=env)  # stderr not a terminal
    assert piped.returncode == 0
    assert "backup:" not in piped.stderr


# -- help ----------------------------------------------------------------------


def _option_blocks(help_text: str) -> dict[str, str]:
    """``--flag`` → its help paragraph, from ``--help`` output."""
    blocks: dict[str, str] = {}
    current = ""
    for line in help_text.splitlines():
        match = re.match(r"  (-\w, )?(--[\w-]+)", line)
        if match:
            current = match.group(2)
            blocks[current] = line
        elif current and line.startswith("    "):
            blocks[current] += " " + line.strip()
        else:
            current = ""
    return blocks


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_help_states_its_default(command: str) -> None:
    done = _run(*command.split(), "--help", env=_env())
    assert done.returncode == 0
    blocks = _option_blocks(done.stdout)
    assert "--config" in blocks
    assert len(blocks) >= 3
    for flag, text in blocks.items():
        if flag == "--help":
            continue
        text = re.sub(r"\s+", " ", text)
        assert "default" in text or "(required)" in text or "command line only" in text, (
            command,
            flag,
            text,
        )


def test_top_level_help_states_the_naming_rule_and_exit_statuses() -> None:
    text = re.sub(r"\s+", " ", _run("--help", env=_env()).stdout)
    assert "LETHE_SOME_FLAG" in text
    assert "Exit status: 0 success; 1 a check failed" in text
    assert "LETHE_SOME_FLAG" in re.sub(r"\s+", " ", _run("backup", "--help", env=_env()).stdout)


def test_serve_json_names_the_metrics_port_it_bound(tmp_path: Path, kek_env: str) -> None:
    """``--metrics-listen 127.0.0.1:0`` is reported with the port the kernel chose."""
    port = free_port()
    env = _env(LETHE_KEK=kek_env)
    argv = [sys.executable, "-m", "server.cli", "serve", "--data", str(tmp_path / "d")]
    argv += ["--listen", f"127.0.0.1:{port}", "--metrics-listen", "127.0.0.1:0"]
    argv += ["--embedder", "none", "--json"]
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        try:
            ready = _serve_document(proc)
            host, _, bound = ready["metrics_listen"].rpartition(":")
            assert host == "127.0.0.1"
            assert int(bound) > 0
            with urllib.request.urlopen(f"http://127.0.0.1:{bound}/metrics", timeout=10) as r:
                assert b"lethe_" in r.read()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
