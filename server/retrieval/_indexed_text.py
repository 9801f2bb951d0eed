"""What each record is indexed under: plain texts, contextual dates, session keys, BM25 terms.

In full: the plain text of a turn or a memory, a turn's contextual date and
session key (UTC days, cached per day), and the BM25 terms of its texts, each
text analysed once (:class:`TermMemo`).

Shared by the index upkeep and search (:mod:`server.retrieval`) and the writers that
hand what they sealed to it (``AppendTurns``).
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime

from index import analyze
from server.store import MemoryView, TurnMeta, TurnView

__all__ = ["TermMemo", "date_text", "indexed_text", "plain_text", "session_key"]


def indexed_text(view: TurnView | MemoryView) -> str:
    """The plain text a record is indexed under (see :meth:`server.retrieval.Retriever._texts`)."""
    if isinstance(view, TurnView):
        return plain_text(view.speaker, view.text)
    if view.content.text or view.content.edge is None:
        return view.content.text
    return " ".join(view.content.edge)


def plain_text(speaker: str, text: str) -> str:
    """What the dense and plain legs index for a turn: ``speaker: text``."""
    return f"{speaker}: {text}" if speaker else text


def date_text(seconds: float) -> str:
    """A turn's time as indexed in the contextual leg, e.g. ``8 May 2023`` (UTC)."""
    return _day_texts(_utc_day(seconds))[0]


def session_key(meta: TurnMeta) -> str:
    """The session a turn belongs to: its thread and UTC day, ``"t1/2023-05-08"``."""
    return f"{meta.thread}/{_day_texts(_utc_day(meta.time))[1]}"


def _utc_day(seconds: float) -> int:
    """The UTC day (days since the epoch) ``datetime.fromtimestamp`` puts ``seconds`` in.

    Within a microsecond of midnight it rounds, so those ask it.
    """
    day = math.floor(seconds / 86400.0)
    into = seconds - day * 86400.0
    if 1e-6 < into < 86400.0 - 1e-6:
        return day
    return datetime.fromtimestamp(seconds, tz=UTC).toordinal() - _EPOCH_ORDINAL


_EPOCH_ORDINAL = datetime(1970, 1, 1, tzinfo=UTC).toordinal()


@functools.lru_cache(maxsize=4096)
def _day_texts(day: int) -> tuple[str, str]:
    """``("8 May 2023", "2023-05-08")`` of a UTC day (days since the epoch).

    Every indexed turn needs both, and turns come in runs of the same day.
    """
    when = datetime.fromtimestamp(day * 86400.0, tz=UTC)
    return f"{when.day} {when.strftime('%B %Y')}", f"{when:%Y-%m-%d}"


@functools.lru_cache(maxsize=4096)
def _day_terms(day: int) -> tuple[str, ...]:
    """``analyze`` of a UTC day's :func:`date_text`."""
    return tuple(analyze(_day_texts(day)[0]))


class TermMemo:
    """The BM25 terms (:func:`index.analyze`) of the texts one index update handles.

    Each text is analysed once however many legs and contexts hold it.

    A turn's plain text is indexed in the plain leg, in the session leg, in its
    own contextual text and in its successor's; :meth:`contextual` gives the
    terms of the contextual text ``f"{date_text(t)}. {prev} {text}"`` from the
    parts' terms. That is exact: a term is a run of two or more word characters,
    so none crosses the ``". "`` and ``" "`` between the parts, and lower-casing
    maps each part as it maps it alone (a final sigma is decided by what follows
    up to the next character that is neither cased nor case-ignorable, here the
    space; ``tests/server/test_index_upkeep.py`` checks it on LoCoMo and on
    generated text).

    Lives for one update (its memory is the batch's terms). Not thread-safe.
    """

    __slots__ = ("_terms",)

    def __init__(self) -> None:
        self._terms: dict[str, list[str]] = {}

    def terms(self, text: str) -> list[str]:
        """``analyze(text)``, computed once per distinct text (do not mutate it)."""
        got = self._terms.get(text)
        if got is None:
            got = self._terms[text] = analyze(text)
        return got

    def contextual(self, seconds: float, prev: str, text: str) -> list[str]:
        """``analyze(f"{date_text(seconds)}. {prev} {text}")``, from the parts."""
        return [*_day_terms(_utc_day(seconds)), *self.terms(prev), *self.terms(text)]
