"""The README's Python snippets run as written against a real server: every
```python block, in order, in one namespace, with ``LETHE_TARGET`` and
``LETHE_TOKEN`` set as a reader would set them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import Lethe

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_python_snippets_run_as_written(
    lethe: Lethe, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = _blocks()
    assert len(blocks) >= 4
    monkeypatch.setenv("LETHE_TARGET", f"127.0.0.1:{lethe.port}")
    monkeypatch.setenv("LETHE_TOKEN", lethe.token("alice"))
    namespace: dict[str, object] = {"__name__": "readme"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)  # noqa: S102
    out = capsys.readouterr().out
    assert "I adopted a puppy called Biscuit" in out
    assert "NOT_FOUND RECORD_DELETED" in out
    assert "['thread_id']" in out
    assert "PENDING I prefer green tea" in out
    assert "{'text': 'has a puppy called Biscuit'}" in out
    assert out.rstrip().endswith("None")
