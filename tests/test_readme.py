"""The README runs as written.

Every command of the README runs as written, in order, from a directory
laid out as a fresh clone (its ``.venv`` is this one): the server, tokens, the
Python example, audit, probe, backup, rotate, restore, and — where the tool
is on this machine — grpcurl and protoc. The only change the test makes is
the addresses: its own free ports instead of 50051 and 9464, which other
servers on a shared machine may hold; and ``HOME`` is a temporary one, so the
KEK the first start creates lands there.

A README command this test does not know how to run fails it: each one is
either run or named in ``NOT_RUN`` with the reason.

The Python snippets of "Use it from Python" run as written too, in order, in
one namespace, against a real server, with ``LETHE_TARGET`` and
``LETHE_TOKEN`` set as a reader would set them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import Lethe, free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOT_RUN = {
    "bash scripts/demo.sh": "minutes on LoCoMo; tests/test_cli.py runs `lethe demo` on the sample",
    "bash scripts/test.sh": "the test suite itself (what CI runs)",
    ".venv/bin/python bench/": "benchmarks: minutes each",
    ".venv/bin/pip install -e '.[bench]'": (
        "the benchmark's optional peer and plot (Chroma, matplotlib): hundreds of MB;"
        " tests/test_bench_smoke.py runs the benchmark without them"
    ),
    "pip install ./lethe-client": "tests/lethe/test_light_client.py installs it in a fresh venv",
    "pip install './lethe-client[langgraph]'": "the same, with the extra the suite installs",
    ".venv/bin/lethe serve --data ./lethe-data --listen 0.0.0.0:50051": (
        "TLS: needs certificates; tests/server/test_tls.py serves TLS and mutual TLS"
    ),
    "grpcurl -cacert": "a TLS server named lethe.example; tests/server/test_tls.py",
    ".venv/bin/lethe token revoke": "the id is an example; tests/server/test_tokens.py revokes one",
    ".venv/bin/lethe owner ": "two shards' data directories: tests/test_owner_move.py",
}
PYTHON_NOT_RUN = {
    "lethe.example:50051": "a TLS server named lethe.example; tests/server/test_tls.py",
}
"""Python blocks (by a string they contain) that are not run, with the reason."""
PYTHON_SECTION = "## Use it from Python"
"""The README section whose Python blocks share one namespace (run by the second test)."""
NEEDS_TOOL = {"grpcurl": "grpcurl", "protoc -I": "protoc"}
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
_COMMENT = re.compile(r"\s+#\s.*$")


def _blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(README.read_text())]


def _section_python_blocks(heading: str) -> list[str]:
    """The ```python blocks between ``heading`` and the next ``## `` heading."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    return [
        body
        for lang, body in ((m.group(1), m.group(2)) for m in _BLOCK.finditer(section))
        if lang == "python"
    ]


def _commands(body: str) -> list[str]:
    out: list[str] = []
    pending = ""
    for line in body.splitlines():
        if pending:
            line = pending + line.lstrip()
            pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=")


class _Shell:
    """Runs one command at a time in ``cwd``, keeping the variables the
    commands set (``T=$(...)``, ``export P=...``) for the next ones, as one
    interactive shell would."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.env = env
        self.state = cwd / ".readme-env.sh"
        self.state.write_text("")

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        keep = _ASSIGNMENT.match(command)
        save = f"declare -p {keep.group(1)} >> {self.state}\n" if keep else ""
        script = f"set -euo pipefail\n. {self.state}\n{command}\n{save}"
        return subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


def test_every_readme_command_runs_as_written(tmp_path: Path) -> None:
    clone = tmp_path / "lethe"
    clone.mkdir()
    (clone / ".venv").symlink_to(ROOT / ".venv")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LETHE_KEK", "XDG_CONFIG_HOME")} | {
        "HOME": str(home)
    }
    grpc_port, metrics_port = free_port(), free_port()

    def local(text: str) -> str:
        return text.replace("127.0.0.1:50051", f"127.0.0.1:{grpc_port}")

    shell = _Shell(clone, env)
    server: subprocess.Popen[str] | None = None
    ran: list[str] = []
    skipped: list[str] = []
    sectioned = _section_python_blocks(PYTHON_SECTION)
    try:
        for lang, body in _blocks():
            if lang == "python" and body in sectioned:
                continue  # test_readme_python_snippets_run_as_written
            if lang == "python" and any(key in body for key in PYTHON_NOT_RUN):
                continue
            if lang == "python":
                (clone / "example.py").write_text(local(body))
                done = shell.run(".venv/bin/python example.py")
                assert done.returncode == 0, done.stderr
                assert "I adopted a puppy" in done.stdout, done.stdout
                assert re.match(r"\d\.\d{3}  owners/alice/threads/", done.stdout)
                ran.append("python example.py")
                continue
            if lang != "sh":
                continue
            for command in _commands(body):
                if any(command.startswith(prefix) for prefix in NOT_RUN):
                    continue
                tool = next((t for key, t in NEEDS_TOOL.items() if key in command), None)
                if tool == "grpcurl" and shutil.which(tool) is None and " -d " in command:
                    _like_grpcurl(local(command), shell)  # the same call, made from Python
                    ran.append(f"(as grpcurl would) {command}")
                    continue
                if tool is not None and shutil.which(tool) is None:
                    skipped.append(command)
                    continue
                if "(server stopped)" in command and server is not None:
                    assert _stop(server) == 0
                    server = None
                command = local(_COMMENT.sub("", command))
                if command.startswith(".venv/bin/lethe serve"):
                    server = _serve(clone, env, command, grpc_port, metrics_port, home)
                    ran.append(command)
                    continue
                done = shell.run(command)
                assert done.returncode == 0, (command, done.stdout, done.stderr)
                _check(command, done.stdout, clone)
                ran.append(command)
    finally:
        if server is not None:
            _stop(server)
    assert len(ran) >= 10, ran
    assert any("lethe restore" in c for c in ran)
    print(f"ran {len(ran)} README commands; skipped (tool absent): {skipped}")


def _like_grpcurl(command: str, shell: _Shell) -> None:
    """Make the call a ``grpcurl -plaintext -H ... -d JSON HOST:PORT Service/Method``
    line makes, where grpcurl is not installed: the JSON parsed into the request
    message (as grpcurl would, by the proto JSON mapping), sent with the header."""
    import shlex

    import grpc
    from google.protobuf import descriptor_pool, json_format, message_factory

    import lethe.v1.lifecycle_pb2
    import lethe.v1.retrieval_pb2
    import lethe.v1.threads_pb2  # noqa: F401  (registers the services)

    words = shlex.split(command)
    header = words[words.index("-H") + 1]
    data = words[words.index("-d") + 1]
    target, full_method = words[-2], words[-1]
    token = shell.run(f'echo "${header.split("$", 1)[1]}"').stdout.strip()
    assert token.startswith("lethe_")
    service_name, method_name = full_method.split("/")
    service = descriptor_pool.Default().FindServiceByName(service_name)
    method = service.methods_by_name[method_name]
    request = message_factory.GetMessageClass(method.input_type)()
    json_format.Parse(data, request)
    response_type = message_factory.GetMessageClass(method.output_type)
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            f"/{full_method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        response = call(request, metadata=(("authorization", f"Bearer {token}"),), timeout=60)
    if method_name == "CreateThread":
        assert response.name == "owners/alice/threads/t1"
    if method_name == "Search":
        assert [h.turn.text for h in response.hits][:1] == ["I adopted a puppy"]


def _stop(server: subprocess.Popen[str]) -> int:
    """SIGTERM (as Ctrl-C would), wait for the graceful stop; its exit status."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if server.stdout is not None:
        server.stdout.close()
    return server.returncode


def _serve(
    clone: Path, env: dict[str, str], command: str, port: int, metrics: int, home: Path
) -> subprocess.Popen[str]:
    argv = [*command.split(), "--listen", f"127.0.0.1:{port}"]
    argv += ["--metrics-listen", f"127.0.0.1:{metrics}"]
    proc = subprocess.Popen(
        argv, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(f"lethe serving {clone / 'lethe-data'}")
    kek_line = proc.stdout.readline()
    (kek,) = (home / ".config" / "lethe" / "keks").glob("*.kek")
    assert kek_line.startswith(f"lethe KEK {kek} (outside"), kek_line
    assert oct(kek.stat().st_mode & 0o777) == "0o600"
    return proc


def _check(command: str, stdout: str, clone: Path) -> None:
    """What each kind of README command must have produced."""
    if "LETHE_CONFIG=" in command or "LETHE_JSON=1" in command:
        document = json.loads(stdout)  # the whole of stdout is one JSON document
        if " audit" in command:
            assert document["healthy"] is True
            assert document["totals"]["orphans"] == 0
            assert "index_drift" not in document["totals"]
        else:
            assert {t["state"] for t in document["tokens"]} == {"active"}
            assert len(document["tokens"]) >= 2  # T and P above
    elif "grpcurl" in command and "CreateThread" in command:
        assert "owners/alice/threads/t1" in stdout
    elif " audit " in command:
        assert "orphans: 0" in stdout
    elif " backup " in command:
        assert (clone / "lethe-backups" / "2026-11-30" / "data.mdb").exists()
    elif " rotate " in command:
        assert stdout.startswith("rotated:")
    elif " restore " in command:
        assert stdout.startswith("restored ")
    elif "protoc -I" in command:
        assert list((clone / "gen" / "java").rglob("*.java"))


@pytest.mark.parametrize("prefix", sorted(NOT_RUN))
def test_every_command_not_run_is_in_the_readme(prefix: str) -> None:
    commands = [c for lang, body in _blocks() if lang == "sh" for c in _commands(body)]
    assert any(c.startswith(prefix) for c in commands), prefix


@pytest.mark.parametrize("key", sorted(PYTHON_NOT_RUN))
def test_every_python_block_not_run_is_in_the_readme(key: str) -> None:
    assert any(lang == "python" and key in body for lang, body in _blocks()), key


def test_readme_python_snippets_run_as_written(
    lethe: Lethe, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = _section_python_blocks(PYTHON_SECTION)
    assert len(blocks) >= 4
    monkeypatch.setenv("LETHE_TARGET", f"127.0.0.1:{lethe.port}")
    monkeypatch.setenv("LETHE_TOKEN", lethe.token("alice"))
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        code = compile(block, f"README.md {PYTHON_SECTION!r} python block {i + 1}", "exec")
        exec(code, namespace)  # noqa: S102
    out = capsys.readouterr().out
    assert "I adopted a puppy called Biscuit" in out
    assert "NOT_FOUND RECORD_DELETED" in out
    assert "['thread_id']" in out
    assert "PENDING I prefer green tea" in out
    assert "{'text': 'has a puppy called Biscuit'}" in out
    assert out.rstrip().endswith("None")
