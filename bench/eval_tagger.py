"""Evaluate the write-time tagger (``server._tagger.propose``) on hand-labelled LoCoMo turns.

Labels: ``tests/data/tagger_labels.jsonl`` (ids and labels only; see ``tests/data/README.md``
for how they were made). Text: LoCoMo (Maharana et al., ACL 2024; CC BY-NC 4.0), read from
``../shared/data/locomo/locomo10.json`` and never copied into this repository.

Role mapping: LoCoMo conversations are two people talking, so ``speaker_b`` of each
conversation plays the ``"ASSISTANT"`` and ``speaker_a`` the ``"USER"``. Each labelled turn
is tagged with ``said_at`` = its session's date (``"%I:%M %p on %d %B, %Y"``, taken as UTC).
A turn counts as predicting a kind if ``propose`` returns at least one proposal of that
kind; scores are per turn and kind.

Prints precision, recall, F1 and support per kind and micro-averaged, for the tuning
split, the held-out split and all labels (``--json``: the same as one JSON object;
``--errors``: also the ids of turns where labels and rules disagree). Exit status 0.

Usage::

    .venv/bin/python bench/eval_tagger.py [--locomo PATH] [--labels PATH] [--json] [--errors]
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from server._tagger import KINDS, propose

_REPO = Path(__file__).resolve().parents[1]
DEFAULT_LOCOMO = Path(__file__).resolve().parents[2] / "shared/data/locomo/locomo10.json"
DEFAULT_LABELS = _REPO / "tests/data/tagger_labels.jsonl"
SPLITS = ("tuning", "held-out")
DATE_FORMAT = "%I:%M %p on %d %B, %Y"


@dataclass(frozen=True)
class Labelled:
    """One labelled turn: ids, role, split, gold kinds and the kinds ``propose`` returned."""

    sample_id: str
    dia_id: str
    role: str
    split: str
    gold: frozenset[str]
    predicted: frozenset[str]


@dataclass(frozen=True)
class Score:
    """Counts for one kind (or the micro total)."""

    tp: int
    fp: int
    fn: int

    @property
    def precision(self) -> float:
        """``tp / (tp + fp)``; 0.0 when the kind was never predicted."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        """``tp / (tp + fn)``; 0.0 when no turn is labelled with the kind."""
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        """The harmonic mean of precision and recall; 0.0 when both are 0."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def support(self) -> int:
        """The number of turns labelled with the kind, ``tp + fn``."""
        return self.tp + self.fn


def load_turns(locomo: Path) -> dict[tuple[str, str], tuple[str, str, float]]:
    """``(sample_id, dia_id) -> (role, text, said_at)`` for every LoCoMo turn."""
    out: dict[tuple[str, str], tuple[str, str, float]] = {}
    samples: list[dict[str, Any]] = json.loads(locomo.read_text())
    for sample in samples:
        conv = sample["conversation"]
        for key, turns in conv.items():
            m = re.fullmatch(r"session_(\d+)", key)
            if not (m and isinstance(turns, list)):
                continue
            when = datetime.strptime(conv[f"{key}_date_time"], DATE_FORMAT)
            said_at = when.replace(tzinfo=UTC).timestamp()
            for turn in turns:
                role = "ASSISTANT" if turn["speaker"] == conv["speaker_b"] else "USER"
                out[sample["sample_id"], turn["dia_id"]] = (role, turn["text"], said_at)
    return out


def evaluate(locomo: Path = DEFAULT_LOCOMO, labels: Path = DEFAULT_LABELS) -> list[Labelled]:
    """Run :func:`propose` on every labelled turn; return gold and predicted kinds."""
    turns = load_turns(locomo)
    out = []
    for line in labels.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        role, text, said_at = turns[row["sample_id"], row["dia_id"]]
        if role != row["role"]:
            raise ValueError(f"{row['sample_id']} {row['dia_id']}: role {role} != {row['role']}")
        predicted = frozenset(p.kind for p in propose(role, text, said_at))
        out.append(
            Labelled(
                row["sample_id"],
                row["dia_id"],
                role,
                row["split"],
                frozenset(row["labels"]),
                predicted,
            )
        )
    return out


def score(rows: list[Labelled]) -> dict[str, Score]:
    """Per-kind scores and ``"micro"`` (counts summed over kinds)."""
    scores = {}
    for kind in KINDS:
        tp = sum(kind in r.gold and kind in r.predicted for r in rows)
        fp = sum(kind not in r.gold and kind in r.predicted for r in rows)
        fn = sum(kind in r.gold and kind not in r.predicted for r in rows)
        scores[kind] = Score(tp, fp, fn)
    scores["micro"] = Score(
        sum(s.tp for s in scores.values()),
        sum(s.fp for s in scores.values()),
        sum(s.fn for s in scores.values()),
    )
    return scores


def _as_dict(scores: dict[str, Score], turns: int) -> dict[str, Any]:
    out: dict[str, Any] = {"turns": turns}
    for kind, s in scores.items():
        out[kind] = {
            "precision": s.precision,
            "recall": s.recall,
            "f1": s.f1,
            "support": s.support,
            "tp": s.tp,
            "fp": s.fp,
            "fn": s.fn,
        }
    return out


def _table(title: str, rows: list[Labelled]) -> str:
    lines = [
        f"{title} ({len(rows)} turns)",
        f"  {'kind':<14} {'prec':>6} {'recall':>6} {'F1':>6} {'support':>7} {'tp':>4} {'fp':>4}",
    ]
    for kind, s in score(rows).items():
        lines.append(
            f"  {kind:<14} {s.precision:6.3f} {s.recall:6.3f} {s.f1:6.3f} {s.support:7d}"
            f" {s.tp:4d} {s.fp:4d}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Score the tagger and print the tables, or with ``--json`` one JSON object.

    Args:
        argv: The command line without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--labels", type=Path, default=DEFAULT_LABELS)
    parser.add_argument("--errors", action="store_true", help="list disagreeing turn ids")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = parser.parse_args(argv)
    rows = evaluate(args.locomo, args.labels)
    if args.json:
        groups = {split: [r for r in rows if r.split == split] for split in SPLITS}
        groups["all"] = rows
        print(json.dumps({name: _as_dict(score(g), len(g)) for name, g in groups.items()}))
        return 0
    for split in SPLITS:
        print(_table(split, [r for r in rows if r.split == split]))
    print(_table("all", rows))
    if args.errors:
        for r in rows:
            if r.gold != r.predicted:
                print(
                    f"{r.split:<8} {r.sample_id} {r.dia_id:<7} {r.role:<9}"
                    f" gold={sorted(r.gold)} predicted={sorted(r.predicted)}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
