"""What each record is indexed under: the plain text of a turn or a memory, and a
turn's contextual date and session key (UTC days, cached per day).

Shared by the index upkeep and search (:mod:`server._search`) and the writers that
hand what they sealed to it (``AppendTurns``).
"""

from __future__ import annotations

import functools
import math
from datetime import UTC, datetime

from server.store import MemoryView, TurnMeta, TurnView

__all__ = ["date_text", "indexed_text", "plain_text", "session_key"]


def indexed_text(view: TurnView | MemoryView) -> str:
    """The plain text a record is indexed under (see :meth:`server._search.Retriever._texts`)."""
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
    """The UTC day (days since the epoch) ``datetime.fromtimestamp`` puts ``seconds``
    in: within a microsecond of midnight it rounds, so those ask it."""
    day = math.floor(seconds / 86400.0)
    into = seconds - day * 86400.0
    if 1e-6 < into < 86400.0 - 1e-6:
        return day
    return datetime.fromtimestamp(seconds, tz=UTC).toordinal() - _EPOCH_ORDINAL


_EPOCH_ORDINAL = datetime(1970, 1, 1, tzinfo=UTC).toordinal()


@functools.lru_cache(maxsize=4096)
def _day_texts(day: int) -> tuple[str, str]:
    """``("8 May 2023", "2023-05-08")`` of a UTC day (days since the epoch): every
    indexed turn needs both, and turns come in runs of the same day."""
    when = datetime.fromtimestamp(day * 86400.0, tz=UTC)
    return f"{when.day} {when.strftime('%B %Y')}", f"{when:%Y-%m-%d}"
