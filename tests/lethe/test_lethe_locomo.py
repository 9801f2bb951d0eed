"""``lethe.locomo``: reading LoCoMo's file layout, evidence normalisation and finding the file.

The layout is read from a small file written here, never a copy of the data.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lethe.locomo import (
    Conversation,
    find_locomo,
    load_locomo,
    normalise_evidence,
    sample_conversation,
    session_of,
)

LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "data" / "locomo" / "locomo10.json"


def _write_sample(path: Path) -> Path:
    """A two-session sample in LoCoMo's layout (sessions listed out of order)."""
    sample = {
        "sample_id": "Conv-7",
        "qa": [{"question": "Who?", "evidence": ["D2:1"], "category": 4}],
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Ben",
            "session_2_date_time": "7:05 pm on 9 June, 2023",
            "session_2": [{"speaker": "Ben", "dia_id": "D2:1", "text": "Second."}],
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "First."},
                {
                    "speaker": "Ben",
                    "dia_id": "D1:2",
                    "text": "Look.",
                    "img_url": ["https://example.invalid/x.jpg"],
                    "blip_caption": "a photo of a dog",
                },
            ],
            "session_3_date_time": "8:00 am on 1 July, 2023",
            "session_3": [],
        },
    }
    path.write_text(json.dumps([sample]))
    return path


def test_load_locomo_reads_sessions_in_order_with_captions_and_dates(tmp_path: Path) -> None:
    (conv,) = load_locomo(_write_sample(tmp_path / "locomo.json"))
    assert conv.sample_id == "Conv-7"
    assert conv.owner == "locomo-conv-7"
    assert list(conv.sessions) == [1, 2]  # the empty session 3 is not a session
    assert conv.sessions[1] == [
        ("Ana", "D1:1", "First."),
        ("Ben", "D1:2", "Look. [image: a photo of a dog]"),
    ]
    assert conv.sessions[2] == [("Ben", "D2:1", "Second.")]
    assert conv.dates[1] == datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()
    assert conv.dates[2] == datetime(2023, 6, 9, 19, 5, tzinfo=UTC).timestamp()
    assert conv.qa == [{"question": "Who?", "evidence": ["D2:1"], "category": 4}]


def test_owner_id_replaces_what_ids_may_not_hold() -> None:
    assert Conversation("Conv 26_b", {}, {}).owner == "locomo-conv-26-b"


def test_normalise_evidence_repairs_squeezed_padded_and_colon_ids() -> None:
    known = {"D1:3", "D1:4", "D30:5", "D11:26"}
    got = normalise_evidence(["D1:3; D1:4", "D30:05", "D:11:26", "D1:3", "D9:9", " "], known)
    assert got == (["D1:3", "D1:4", "D30:5", "D11:26"], 2)  # D9:9 unknown, " " empty


def test_session_of_reads_the_session_number() -> None:
    assert (session_of("D1:3"), session_of("D12:40")) == (1, 12)
    with pytest.raises(ValueError, match="not a dia id"):
        session_of("D1")


def test_sample_conversation_evidence_names_its_own_turns() -> None:
    (conv,) = sample_conversation()
    known = {dia for turns in conv.sessions.values() for _, dia, _ in turns}
    assert (len(known), len(conv.qa)) == (8, 5)
    for qa in conv.qa:
        assert normalise_evidence(qa["evidence"], known) == (qa["evidence"], 0)


def test_find_locomo_takes_a_given_path_that_exists(tmp_path: Path) -> None:
    path = _write_sample(tmp_path / "mine.json")
    assert find_locomo(path) == path


def test_find_locomo_with_a_missing_path_yields_none(tmp_path: Path) -> None:
    """The library answers None; ``lethe demo`` refuses such a ``--locomo`` path before it looks.

    The demo exits with status 2 (tests/test_cli_scripting.py).
    """
    assert find_locomo(tmp_path / "absent.json") is None


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo data not beside the repository")
def test_find_locomo_finds_the_shared_data_beside_the_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # ../shared relative to the working directory is absent
    found = find_locomo()
    assert found is not None
    assert found.resolve() == LOCOMO.resolve()  # ../shared may be a symlink
    convs = load_locomo(found)
    assert [c.sample_id for c in convs][:2] == ["conv-26", "conv-30"]
    assert sum(len(t) for t in convs[0].sessions.values()) == 419
