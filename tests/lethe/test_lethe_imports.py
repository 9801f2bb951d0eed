"""The client side stays apart from the server, its names are pinned, its modules stay short.

ARCHITECTURE.md, "Top-level layout": ``lethe`` never imports ``server``,
``shredder`` or ``index``. STYLE.md: the public names of each ``lethe``
module are pinned. No hand-written module of ``lethe`` is longer than 1,000
lines (the generated ``lethe/v1``, ``lethe/errors`` and blocking client
modules are not counted).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import lethe
from lethe import (
    _rpc,
    _status,
    client,
    demo,
    langgraph,
    locomo,
    mcp,
    names,
    probe,
    receipts,
    remote,
)

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("server", "shredder", "index", "faiss", "lmdb", "nacl", "bm25s", "wordllama")
MAX_LINES = 1000
CLIENT_MODULES = (
    "lethe._rpc",
    "lethe._status",
    "lethe.names",
    "lethe.locomo",
    "lethe.probe",
    "lethe.demo",
    "lethe.client",
    "lethe.langgraph",
    "lethe.mcp",
    "lethe.receipts",
    "lethe.remote",
)


def _loaded_after_import(module: str) -> list[str]:
    """Top-level names of the modules a clean interpreter holds after ``import module``."""
    code = (
        "import json, sys\n"
        f"import {module}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{code}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize("module", CLIENT_MODULES)
def test_client_module_imports_nothing_of_the_server(module: str) -> None:
    loaded = _loaded_after_import(module)
    assert "lethe" in loaded
    assert [m for m in FORBIDDEN if m in loaded] == []


def test_the_typed_client_loads_no_numpy_and_no_langgraph() -> None:
    loaded = _loaded_after_import("lethe.client")
    assert [m for m in ("numpy", "langgraph", "langchain_core") if m in loaded] == []


def test_only_lethe_mcp_loads_the_mcp_sdk() -> None:
    """The ``mcp`` extra is needed by ``lethe.mcp`` alone."""
    for module in ("lethe.client", "lethe.langgraph", "lethe.probe", "lethe.demo"):
        assert "mcp" not in _loaded_after_import(module), module
    assert "mcp" in _loaded_after_import("lethe.mcp")


def test_demo_defers_numpy_and_tqdm_to_the_functions_that_use_them() -> None:
    loaded = _loaded_after_import("lethe.demo")
    assert [m for m in ("numpy", "tqdm") if m in loaded] == []


def test_lethe_package_exports_no_names_of_its_own() -> None:
    assert lethe.__all__ == []


def test_lethe_module_public_names_are_pinned() -> None:
    assert sorted(_rpc.__all__) == [
        "DOMAIN",
        "Metadata",
        "Stubs",
        "bad_fields",
        "error_info",
        "reason_of",
    ]
    assert sorted(_status.__all__) == [
        "DETAIL_TYPES",
        "DOMAIN",
        "STATUS_DETAILS_KEY",
        "status_details",
    ]
    assert sorted(locomo.__all__) == [
        "Conversation",
        "find_locomo",
        "load_locomo",
        "normalise_evidence",
        "sample_conversation",
        "session_of",
    ]
    assert sorted(probe.__all__) == [
        "DEFAULT_OWNER",
        "STAGES",
        "add_probe_arguments",
        "parse_duration",
        "probe",
        "run_probe",
        "stage_record",
        "summarise",
    ]
    assert demo.__all__ == ["run_demo"]
    assert langgraph.__all__ == ["LetheStore"]
    assert sorted(mcp.__all__) == [
        "BearerGate",
        "HANDLERS",
        "Principals",
        "RULES",
        "Refusal",
        "Session",
        "TOOLS",
        "ToolSpec",
        "build_server",
        "run_mcp",
        "serve_http",
        "serve_stdio",
        "tls_config",
        "tool_error",
    ]
    assert sorted(receipts.__all__) == [
        "InvalidReceipt",
        "RECEIPT_DOMAIN",
        "key_id",
        "read_public_keys",
        "read_receipts",
        "sign_receipt",
        "signed_bytes",
        "verify_receipt",
    ]
    assert sorted(remote.__all__) == [
        "AUDIT_FAILURES",
        "CONNECT_TIMEOUT_SECONDS",
        "EXPORT_KINDS",
        "IncompleteExport",
        "RemoteError",
        "audit",
        "connect",
        "export_line",
        "export_owner",
        "forget",
        "message_document",
        "read_export",
        "receipt_document",
        "server_info_document",
        "set_retention",
        "verify_files",
    ]
    for module in (
        _rpc,
        _status,
        locomo,
        probe,
        demo,
        names,
        client,
        langgraph,
        mcp,
        receipts,
        remote,
    ):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_no_hand_written_lethe_module_is_over_a_thousand_lines() -> None:
    generated = (ROOT / "lethe" / "v1", ROOT / "lethe" / "errors")
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / "lethe").rglob("*.py"))
        if not any(path.is_relative_to(folder) for folder in generated)
        and not path.read_text().startswith("# Generated from ")
        and (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
