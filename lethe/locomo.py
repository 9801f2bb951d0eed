"""The LoCoMo conversations, as the demo and the benchmarks read them.

LoCoMo (Maharana et al., "Evaluating Very Long-Term Conversational Memory of
LLM Agents", ACL 2024; CC BY-NC 4.0) is read from
``../shared/data/locomo/locomo10.json`` and never copied into this repository.
Each sample is one :class:`Conversation`: sessions of dialog turns
``(speaker, dia_id, text)`` with their session dates, and the QA items.
:func:`normalise_evidence` repairs the dataset's malformed evidence ids as
``shared/data/README.md`` describes. :func:`sample_conversation` is a short
conversation written for this project, used when LoCoMo is absent.

Imports nothing but the standard library.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = [
    "Conversation",
    "find_locomo",
    "load_locomo",
    "normalise_evidence",
    "sample_conversation",
    "session_of",
]

_DIA_RE = re.compile(r"D(\d+):(\d+)")
_RELATIVE = Path("../shared/data/locomo/locomo10.json")
"""Where LoCoMo lies relative to the working directory of a checkout's root."""


@dataclass
class Conversation:
    """One LoCoMo conversation.

    Attributes:
        sample_id: LoCoMo's id, e.g. ``conv-26``.
        sessions: session number → ``(speaker, dia_id, text)`` turns in order,
            sessions in ascending order; an image's BLIP caption is appended to
            its turn's text as ``" [image: <caption>]"``.
        dates: session number → the session's date, seconds since the epoch (UTC).
        qa: the QA items as in the file (``question``, ``evidence``,
            ``category``, ...).
    """

    sample_id: str
    sessions: dict[int, list[tuple[str, str, str]]]
    dates: dict[int, float]
    qa: list[dict[str, Any]] = field(default_factory=list)

    @property
    def owner(self) -> str:
        """The owner id the conversation is stored under: ``locomo-<sample_id>``."""
        return "locomo-" + re.sub(r"[^a-z0-9-]", "-", self.sample_id.lower())


def _parse_date(text: str) -> float:
    return datetime.strptime(text, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC).timestamp()


def load_locomo(path: Path) -> list[Conversation]:
    """Read ``locomo10.json`` into conversations (sessions in order, captions kept).

    Args:
        path: the ``locomo10.json`` file.

    Returns:
        One conversation per sample, in file order.

    Raises:
        OSError: ``path`` cannot be read.
        ValueError: the file is not JSON, or a session date is not of the form
            ``1:56 pm on 8 May, 2023``.
        KeyError: a sample lacks a field LoCoMo has.
    """
    out = []
    for sample in json.loads(path.read_text()):
        conv = sample["conversation"]
        sessions: dict[int, list[tuple[str, str, str]]] = {}
        dates: dict[int, float] = {}
        for key, value in conv.items():
            m = re.fullmatch(r"session_(\d+)", key)
            if m and isinstance(value, list) and value:
                n = int(m.group(1))
                turns = []
                for turn in value:
                    text = turn["text"]
                    if turn.get("blip_caption"):
                        text += f" [image: {turn['blip_caption']}]"
                    turns.append((turn["speaker"], turn["dia_id"], text))
                sessions[n] = turns
                dates[n] = _parse_date(conv[f"session_{n}_date_time"])
        out.append(
            Conversation(sample["sample_id"], dict(sorted(sessions.items())), dates, sample["qa"])
        )
    return out


def find_locomo(path: Path | None = None) -> Path | None:
    """Where ``locomo10.json`` is.

    Args:
        path: the path the user gave (``--locomo``), or None to look in the
            usual places: ``../shared/data/locomo/locomo10.json`` relative to
            the working directory, then beside this checkout (``shared/`` next
            to the repository root).

    Returns:
        ``path`` if given and it exists; else the first usual place that
        exists; None when there is none (a given ``path`` that does not exist
        also yields None: callers then fall back to :func:`sample_conversation`).
    """
    if path is not None:
        return path if path.exists() else None
    checkout = Path(__file__).resolve().parents[1]
    for candidate in (_RELATIVE, checkout.parent / "shared/data/locomo/locomo10.json"):
        if candidate.exists():
            return candidate
    return None


def sample_conversation() -> list[Conversation]:
    """A short conversation written for this project, used when LoCoMo is absent.

    Returns:
        One conversation (``sample-1``: two sessions of four turns, five QA items).
    """
    s1 = [
        ("Ana", "D1:1", "I finally adopted a rescue greyhound last weekend, her name is Comet."),
        ("Ben", "D1:2", "That's wonderful! How is Comet settling in?"),
        ("Ana", "D1:3", "She sleeps all day on the sofa and sprints in the park at dusk."),
        ("Ben", "D1:4", "I started learning the cello in March, my teacher is very patient."),
    ]
    s2 = [
        ("Ana", "D2:1", "I'm moving to Lisbon in September for a new job at a design studio."),
        ("Ben", "D2:2", "Lisbon! Will you bring Comet with you?"),
        ("Ana", "D2:3", "Yes, the flat has a small garden, perfect for her."),
        ("Ben", "D2:4", "My cello recital is on the 14th of June, I'm nervous."),
    ]
    qa = [
        {"question": "What is the name of Ana's dog?", "evidence": ["D1:1"], "category": 4},
        {"question": "Where is Ana moving?", "evidence": ["D2:1"], "category": 4},
        {"question": "What instrument does Ben play?", "evidence": ["D1:4"], "category": 4},
        {"question": "When is Ben's recital?", "evidence": ["D2:4"], "category": 2},
        {
            "question": "Will the dog have a garden in the new home?",
            "evidence": ["D2:2", "D2:3"],
            "category": 1,
        },
    ]
    base = datetime(2024, 3, 1, tzinfo=UTC).timestamp()
    return [Conversation("sample-1", {1: s1, 2: s2}, {1: base, 2: base + 86400 * 30}, qa)]


def normalise_evidence(raw: list[str], known: set[str]) -> tuple[list[str], int]:
    """Split squeezed ids, fix ``D30:05`` and ``D:11:26``; drop what matches no turn.

    Args:
        raw: a QA item's evidence references as in the file.
        known: the dia ids of the conversation's turns (``D1:3``, ...).

    Returns:
        (normalised ids in order without duplicates, number of references dropped).
    """
    out: list[str] = []
    dropped = 0
    for ref in raw:
        parts = [p for p in re.split(r"[;\s]+", ref.replace("D:", "D")) if p]
        if not parts:
            dropped += 1
        for part in parts:
            m = _DIA_RE.fullmatch(part)
            dia = f"D{int(m.group(1))}:{int(m.group(2))}" if m else part
            if dia in known:
                if dia not in out:
                    out.append(dia)
            else:
                dropped += 1
    return out, dropped


def session_of(dia_id: str) -> int:
    """The session number of a normalised dia id: ``D12:3`` → 12.

    Args:
        dia_id: ``D<session>:<turn>``, as :func:`normalise_evidence` returns.

    Returns:
        The session number.

    Raises:
        ValueError: ``dia_id`` is not of that form.
    """
    m = _DIA_RE.fullmatch(dia_id)
    if m is None:
        raise ValueError(f"not a dia id: {dia_id!r}")
    return int(m.group(1))
