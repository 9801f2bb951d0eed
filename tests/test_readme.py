"""The documentation runs as written.

Every command of ``README.md``, of every page under ``docs/`` and of
``THREAT_MODEL.md`` and ``CONTRIBUTING.md`` runs as written, in order, each
document in a shell of its own, from a directory laid out as a fresh clone
(its ``.venv`` is this one): the server, tokens, audit, probe, backup,
rotate, restore, the scripting examples, the nginx config and the moved-away
markers, and — where the tool is on this machine — grpcurl, curl and protoc.
The only change the test makes is the addresses: its own free ports instead
of 50051, 8080 and 9464, which other servers on a shared machine may hold; and
``HOME`` is a temporary one, so the KEK the first start creates lands there.
A second ``lethe serve`` in a document stops the first (its text says to).

A page that builds on the README's quickstart (a server running on
``./lethe-data``, its token in ``T``) gets those README commands first, as
its reader has run them (``PRELUDE``).

A documented command this test does not know how to run fails it: each one
is either run or named in ``NOT_RUN`` with the reason.

Python: consecutive ``python`` blocks of a document run as one script in
that document's shell, as a reader pasting them in order into one
interpreter would (the README's quickstart); the blocks of
``docs/api-guide.md`` run in order, in one namespace, in this process,
against a real server, with ``LETHE_TARGET`` and ``LETHE_TOKEN`` set as a
reader would set them; the blocks in ``PYTHON_NOT_RUN`` are not run, for
the reason given.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Lethe, free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
API_GUIDE = "docs/api-guide.md"
"""The page whose Python blocks share one namespace in this process."""


def _documents() -> list[Path]:
    """Every document whose commands and snippets must run, README first."""
    pages = sorted(DOCS.rglob("*.md"))
    return [README, *pages, ROOT / "THREAT_MODEL.md", ROOT / "CONTRIBUTING.md"]


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


SERVE = ".venv/bin/lethe serve --data ./lethe-data"
TOKEN = "export T=$(.venv/bin/lethe token create --data ./lethe-data --owner alice)"
PRELUDE = {
    "docs/sharding.md": (SERVE,),
    "docs/other-languages.md": (SERVE, TOKEN),
    "docs/mcp.md": (SERVE, TOKEN),
}
"""What a page assumes its reader has run: the README quickstart's commands."""

NOT_RUN = {
    "bash scripts/demo.sh": "minutes on LoCoMo; tests/test_cli.py runs `lethe demo` on the sample",
    "bash scripts/test.sh": "the test suite itself (what CI runs)",
    ".venv/bin/python bench/": "benchmarks: minutes each",
    ".venv/bin/pip install -e '.[bench]'": (
        "the benchmark's optional peer and plot (Chroma, matplotlib): hundreds of MB;"
        " tests/test_bench_smoke.py runs the benchmark without them"
    ),
    "pip install ./clients/python": "tests/lethe/test_light_client.py installs it in a fresh venv",
    "pip install './clients/python[langgraph]'": "the same, with the extra the suite installs",
    ".venv/bin/lethe serve --data ./lethe-data --listen 0.0.0.0:50051": (
        "TLS: needs certificates; tests/server/test_tls.py serves TLS and mutual TLS"
    ),
    "grpcurl -cacert": "a TLS server named lethe.example; tests/server/test_tls.py",
    ".venv/bin/lethe token revoke": "the id is an example; tests/server/test_tokens.py revokes one",
    ".venv/bin/lethe owner ": "two shards' data directories: tests/test_owner_move.py",
    ".venv/bin/ruff ": "the whole tree, minutes: scripts/test.sh runs it (CI)",
    ".venv/bin/mypy ": "the whole tree, minutes: scripts/test.sh runs it (CI)",
    ".venv/bin/python -m pytest": "the test suite itself, this test included",
    ".venv/bin/python scripts/gen_": (
        "tests/test_generated_code.py regenerates what they write and fails on any difference"
    ),
    "../shared/tools/import-cycles": (
        "a tool of the shared workspace, outside a clone; tests/test_layout.py checks for cycles"
    ),
    "duplicates --change": "a tool of the shared workspace; a fresh clone has no change to read",
    ".venv/bin/pip install -e '.[mcp]'": "the mcp extra, which scripts/test.sh installs (CI)",
    'LETHE_TOKEN="$T" .venv/bin/lethe mcp': (
        "MCP on stdin and stdout, for a host: the page's Python script starts it as one, and"
        " tests/lethe/test_mcp.py runs it over stdio"
    ),
    ".venv/bin/lethe mcp --transport http": (
        "serves until stopped: tests/lethe/test_mcp.py runs it with the mcp SDK's HTTP client"
    ),
    "claude mcp add": "needs Claude Code; tests/lethe/test_mcp.py drives both transports",
    "(cd clients/typescript && npm ci && npm run generate)": (
        "tests/test_generated_code.py regenerates clients/typescript/src/gen and fails on any "
        "difference"
    ),
    "(cd clients/typescript && npm ci && npm pack)": (
        "npm and the registry; tests/crosslang/test_typescript_client.py builds the package and "
        "runs it against real servers"
    ),
}
PYTHON_NOT_RUN = {
    "lethe.example:50051": "a TLS server named lethe.example; tests/server/test_tls.py",
    "from agents.mcp import": "needs the openai-agents package and a model's API key",
}
"""Python blocks (by a string they contain) that are not run, with the reason."""
NEEDS_TOOL = {"grpcurl": "grpcurl", "protoc -I": "protoc", "curl ": "curl"}
MUST_RUN = {
    "README.md": ("lethe serve", "lethe token create", "python quickstart.py"),
    "docs/operating.md": (
        "lethe serve",
        "lethe probe",
        "lethe retention",
        "lethe export",
        "lethe forget",
        "lethe receipt verify",
        "lethe receipt rotate-key",
        "lethe rotate",
        "lethe restore",
    ),
    "docs/sharding.md": ("shard nginx-config", "shard mark-moved", "shard unmark-moved"),
    "docs/other-languages.md": ("Threads/CreateThread", "Retrieval/Search", "--http-listen"),
    "docs/mcp.md": ("python quickstart.py",),
}
"""What each document must have run: a check that nothing was skipped unseen."""
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
_COMMENT = re.compile(r"\s+#\s.*$")


def _blocks(path: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(path.read_text())]


def _python_blocks(path: Path) -> list[str]:
    return [body for lang, body in _blocks(path) if lang == "python"]


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


def _script_runs(path: Path) -> Iterator[tuple[str, str]]:
    """The document as the test runs it, in order.

    Yields ``("sh", command)`` one command at a time and ``("python", script)``
    for each run of consecutive Python blocks.
    """
    script: list[str] = []
    for lang, body in _blocks(path):
        if lang == "python":
            script.append(body)
            continue
        if script:
            yield "python", "\n".join(script)
            script = []
        if lang == "sh":
            for command in _commands(body):
                yield "sh", command
    if script:
        yield "python", "\n".join(script)


_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=")


class _Shell:
    """Runs one command at a time in ``cwd``, as one interactive shell would.

    The variables the commands set (``T=$(...)``, ``export P=...``) are kept
    for the next ones.
    """

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


class _Reader:
    """One reader of one document.

    A fresh clone, a temporary ``HOME``, free ports, one shell, and the
    server the document starts (at most one at a time).
    """

    def __init__(self, tmp_path: Path) -> None:
        self.clone = tmp_path / "lethe"
        self.clone.mkdir()
        (self.clone / ".venv").symlink_to(ROOT / ".venv")
        self.home = tmp_path / "home"
        self.home.mkdir()
        drop = ("LETHE_KEK", "XDG_CONFIG_HOME")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env["HOME"] = str(self.home)
        self.grpc_port, self.metrics_port = free_port(), free_port()
        self.http_port = free_port()
        self.shell = _Shell(self.clone, self.env)
        self.server: subprocess.Popen[str] | None = None
        self.ran: list[str] = []
        self.skipped: list[str] = []

    def local(self, text: str) -> str:
        text = text.replace("127.0.0.1:50051", f"127.0.0.1:{self.grpc_port}")
        return text.replace("127.0.0.1:8080", f"127.0.0.1:{self.http_port}")

    def python(self, script: str, document: str) -> None:
        (self.clone / "quickstart.py").write_text(self.local(script))
        done = self.shell.run(".venv/bin/python quickstart.py")
        assert done.returncode == 0, done.stderr
        _check_python(document, done.stdout)
        self.ran.append("python quickstart.py")

    def command(self, command: str) -> None:
        if any(command.startswith(prefix) for prefix in NOT_RUN):
            return
        tool = next((t for key, t in NEEDS_TOOL.items() if key in command), None)
        if tool == "grpcurl" and shutil.which(tool) is None and " -d " in command:
            _like_grpcurl(self.local(command), self.shell)  # the same call, made from Python
            self.ran.append(f"(as grpcurl would) {command}")
            return
        if tool is not None and shutil.which(tool) is None:
            self.skipped.append(command)
            return
        if "(server stopped)" in command and self.server is not None:
            assert _stop(self.server) == 0
            self.server = None
        command = self.local(_COMMENT.sub("", command))
        if command.startswith(".venv/bin/lethe serve"):
            if self.server is not None:  # the reader stopped the first (Ctrl-C), as told
                assert _stop(self.server) == 0
            self.server = _serve(self, command)
            self.ran.append(command)
            return
        done = self.shell.run(command)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        _check(command, done.stdout, self.clone)
        self.ran.append(command)

    def close(self) -> None:
        if self.server is not None:
            _stop(self.server)
            self.server = None


@pytest.mark.parametrize("document", _documents(), ids=_name)
def test_every_documented_command_runs_as_written(document: Path, tmp_path: Path) -> None:
    """Each document's commands and scripts run in one shell of their own, in order."""
    name = _name(document)
    reader = _Reader(tmp_path)
    try:
        for command in PRELUDE.get(name, ()):
            reader.command(command)
        for kind, text in _script_runs(document):
            if kind == "sh":
                reader.command(text)
            elif name == API_GUIDE:
                continue  # test_api_guide_python_snippets_run_as_written
            elif not any(key in text for key in PYTHON_NOT_RUN):
                reader.python(text, name)
    finally:
        reader.close()
    for expected in MUST_RUN.get(name, ()):
        assert any(expected in command for command in reader.ran), (expected, reader.ran)
    print(f"{name}: ran {len(reader.ran)} commands; skipped (tool absent): {reader.skipped}")


def test_the_prelude_is_the_readme_quickstart() -> None:
    """What a page assumes its reader has run is what the README has them run."""
    sh = [body for lang, body in _blocks(README) if lang == "sh"]
    commands = [_COMMENT.sub("", c) for body in sh for c in _commands(body)]
    for prelude in PRELUDE.values():
        for command in prelude:
            assert command in commands, command


def _like_grpcurl(command: str, shell: _Shell) -> None:
    """Make the call of a ``grpcurl -plaintext -H … -d JSON HOST:PORT Service/Method`` line.

    For where grpcurl is not installed: the JSON parsed into the request
    message (as grpcurl would, by the proto JSON mapping), sent with the header.
    """
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


def _serve(reader: _Reader, command: str) -> subprocess.Popen[str]:
    argv = [*command.split(), "--listen", f"127.0.0.1:{reader.grpc_port}"]
    argv += ["--metrics-listen", f"127.0.0.1:{reader.metrics_port}"]
    proc = subprocess.Popen(
        argv,
        cwd=reader.clone,
        env=reader.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith(f"lethe serving {reader.clone / 'lethe-data'}")
    kek_line = proc.stdout.readline()
    (kek,) = (reader.home / ".config" / "lethe" / "keks").glob("*.kek")
    assert kek_line.startswith(f"lethe KEK {kek} (outside"), kek_line
    assert oct(kek.stat().st_mode & 0o777) == "0o600"
    return proc


def _check(command: str, stdout: str, clone: Path) -> None:
    """What each kind of documented command must have produced."""
    if "LETHE_CONFIG=" in command or "LETHE_JSON=1" in command:
        document = json.loads(stdout)  # the whole of stdout is one JSON document
        if " audit" in command:
            assert document["healthy"] is True
            assert document["totals"]["orphans"] == 0
            assert "index_drift" not in document["totals"]
        else:
            assert {t["state"] for t in document["tokens"]} == {"active"}
            assert len(document["tokens"]) >= 2  # the laptop token and P above
    elif "grpcurl" in command and "CreateThread" in command:
        assert "owners/alice/threads/t1" in stdout
    elif " retention " in command:
        assert stdout.startswith("owners/alice: new records live 365d"), stdout
    elif " export " in command:
        assert stdout.startswith("wrote "), stdout
        assert oct((clone / "alice-export.jsonl").stat().st_mode & 0o777) == "0o600"
    elif " forget " in command:
        assert "signed by store" in stdout
        assert json.loads((clone / "erasure.json").read_text())["receipt"]["signature"]
    elif " receipt verify " in command:
        assert stdout.strip().endswith(": ok"), stdout  # exit 0 and one line per receipt
    elif " receipt public-key " in command:
        assert json.loads((clone / "lethe-keys.json").read_text())["keys"]
    elif command.startswith("curl ") and "Bearer" not in command:
        assert json.loads(stdout)["details"][0]["debug"]["reason"] == "MISSING_TOKEN", stdout
    elif command.startswith("curl ") and "CreateThread" in command:
        assert json.loads(stdout)["name"] == "owners/alice/threads/t2", stdout
    elif command.startswith("curl ") and "AppendTurns" in command:
        assert json.loads(stdout)["turns"][0]["state"] == "COMMITTED", stdout
    elif command.startswith("curl ") and "Search" in command:
        assert json.loads(stdout)["hits"][0]["turn"]["text"] == "I adopted a kitten", stdout
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
    elif "shard nginx-config" in command:
        assert "grpc_pass" in (clone / "lethe.conf").read_text()
    elif "shard mark-moved" in command:
        assert "OWNER_MOVED" in stdout
    elif "shard moved" in command:
        assert stdout.startswith("owners/alice\tc\t10.0.0.3:50051")
    elif "shard unmark-moved" in command:
        assert "served here again" in stdout


def _check_python(document: str, stdout: str) -> None:
    """What the Python of a document (run as one script) must have printed."""
    if document == "docs/mcp.md":
        assert stdout.splitlines() == [
            "15",
            "owners/alice/threads/mcp-chat/turns/1 PENDING",
            "0",
            "1",
            "1",
            "True RECORD_DELETED",
        ], stdout
        return
    if document != "README.md":
        return
    lines = stdout.splitlines()
    assert lines[0] == "['PENDING', 'PENDING', 'PENDING']", stdout
    assert lines[1] == "0", stdout  # pending turns are not in the owner's search
    assert re.match(
        r"\d\.\d{3}  owners/alice/threads/[^/]+/turns/1  I adopted a puppy called Biscuit$",
        lines[2],
    ), stdout
    receipt = next(line for line in lines if line.startswith("owners/alice/deletions/"))
    assert receipt.endswith(" 1"), receipt
    assert "'keystore'" in stdout, stdout
    assert "'index'" in stdout, stdout
    assert re.search(r"^\d{4}-\d\d-\d\dT", stdout, re.M), stdout  # the shred horizon is set
    assert "puppy" not in lines[-1], stdout


@pytest.mark.parametrize("prefix", sorted(NOT_RUN))
def test_every_command_not_run_is_documented(prefix: str) -> None:
    """``NOT_RUN`` names no command that has left the documents."""
    commands = [
        c
        for path in _documents()
        for lang, body in _blocks(path)
        if lang == "sh"
        for c in _commands(body)
    ]
    assert any(c.startswith(prefix) for c in commands), prefix


@pytest.mark.parametrize("key", sorted(PYTHON_NOT_RUN))
def test_every_python_block_not_run_is_documented(key: str) -> None:
    """``PYTHON_NOT_RUN`` names no block that has left the documents."""
    blocks = [body for path in _documents() for body in _python_blocks(path)]
    assert any(key in body for body in blocks), key


def test_api_guide_python_snippets_run_as_written(
    lethe: Lethe, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API guide's snippets run in order, in one namespace, and print what they say."""
    blocks = _python_blocks(ROOT / API_GUIDE)
    assert len(blocks) >= 7
    monkeypatch.setenv("LETHE_TARGET", f"127.0.0.1:{lethe.port}")
    monkeypatch.setenv("LETHE_TOKEN", lethe.token("alice"))
    namespace: dict[str, object] = {"__name__": "api_guide"}
    for i, block in enumerate(blocks):
        code = compile(block, f"{API_GUIDE} python block {i + 1}", "exec")
        exec(code, namespace)  # noqa: S102
    out = capsys.readouterr().out
    assert "I adopted a puppy called Biscuit" in out
    assert "NOT_FOUND RECORD_DELETED" in out
    assert "['thread_id']" in out
    assert "PENDING I prefer green tea" in out
    # memories and lineage
    assert "SLOT_CONFLICT" in out
    assert "2 Saturday's dinner: 14 guests" in out
    assert "SUPERSEDED" in out
    assert re.search(r"turns/1 -> owners/alice/memories/\S+ 2$", out, re.M), out
    # context assembly and a reply that declares it
    assert "True True\n2 1 1\nTrue\nRECORD_DELETED\nSOURCE_DELETED\n" in out
    # repairs
    assert 'SEALED\n["Let\'s plan the trip to Lisbon"]\n[2, 3]\nLESSON 0\n2\n' in out
    # the limits of lineage: an echo found and tainted, a summary of it refused
    assert "1 True\nTrue\nECHOES_FORGOTTEN\n" in out
    # the LangGraph store
    assert "{'text': 'has a puppy called Biscuit'}" in out
    assert out.rstrip().endswith("None")


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("document", [*_documents(), ROOT / "CHANGELOG.md"], ids=_name)
def test_every_relative_link_resolves(document: Path) -> None:
    """Every relative link names a file that exists, and a heading of it where it names one."""
    for target in _LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        assert resolved.exists(), (target, document)
        if anchor and resolved.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", resolved.read_text(), re.M)
            assert anchor in {_slug(h) for h in headings}, (target, document)


@pytest.mark.parametrize("document", [*_documents(), ROOT / "CHANGELOG.md"], ids=_name)
def test_no_issue_numbers_in_the_documentation(document: Path) -> None:
    """The documents say what is true now; issue numbers belong to the tracker."""
    assert not re.search(r"\bissues? \d+", document.read_text(), re.I)
