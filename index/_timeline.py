"""The time legs of retrieval: a time-expression prior and a session-date window.

:class:`TimeIndex` holds, for each turn id, when it was said (seconds since the Unix
epoch, UTC) and whether its text carries a time expression
(:func:`index._temporal.time_expression_score`). It answers two legs, both heuristics
for English questions (see :mod:`index._temporal` for the rules and their source):

- :meth:`TimeIndex.prior`: for a question that asks when or how long, the candidate
  ids (found by the other legs) whose text holds a time expression, each with that
  score. It re-ranks what was found; it never adds an id.
- :meth:`TimeIndex.window`: for a question that names days, months or years, the turns
  said on or just after them: inside a named period a turn scores 1; in the
  ``slack`` after it the score falls linearly from 1 to 0 (an event is told in the
  conversations after it, as LoCoMo's sessions do).

Both return ``[]`` for a question they do not apply to, so the caller adds an empty
leg, never a filter. The index holds one float and one flag per id, no text: the
times and ids as NumPy arrays in time order and in id order (32 bytes a turn; a
dict and a list of tuples held 180 at 100k turns), the scores of the turns with a
time expression in a dict.

Threads: any thread may call any method; one mutex guards the index.
:meth:`TimeIndex.to_state` and :meth:`TimeIndex.from_state` hand its whole state to a
caller that keeps it (Lethe's encrypted index snapshots) and make it again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from index._sessions import _as_id_list
from index._state import State
from index._temporal import NamedPeriod, asks_when, named_periods, time_expression_score

__all__ = ["WINDOW_DEPTH", "WINDOW_SLACK", "TimeIndex"]

WINDOW_SLACK: Mapping[str, float] = {"day": 1 * 86400.0, "month": 31 * 86400.0, "year": 0.0}
"""Seconds after a named period in which a turn still scores (falling linearly to 0),
by the period's granularity; chosen on LoCoMo conversations 1-5 with the fusion weights
(``bench/eval_retrieval.py``; day 0/1/3 days, month 0/14/31 days were tried)."""

_TURN_BYTES = 32
"""Bytes per held turn: its time and id in time order and in id order (8 bytes each)."""
_EXPR_BYTES = 50
"""Estimated bytes per held turn with a time expression."""

WINDOW_DEPTH = 200
"""Most turns the session-date window leg hands to the fusion (a group of equal scores
that this cut would split is left out whole: :meth:`TimeIndex.window`)."""


class TimeIndex:
    """Turn times and time-expression flags keyed by int64 ids, held only in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t = np.zeros(0, np.float64)  # times, ascending by (time, id)
        self._i = np.zeros(0, np.int64)  # their ids
        self._by_id = np.zeros(0, np.int64)  # the ids, ascending
        self._t_by_id = np.zeros(0, np.float64)  # their times
        self._expr: dict[int, float] = {}  # id -> time-expression score (> 0 only)

    def add(self, ids: npt.ArrayLike, times: Sequence[float], texts: Sequence[str]) -> None:
        """Hold turns' times and time-expression scores, replacing any held under the same ids.

        Args:
            ids: ``(n,)`` integers within int64, distinct.
            times: ``n`` times, seconds since the Unix epoch (finite).
            texts: ``n`` turn texts (scored here, not kept).

        Raises:
            ValueError: ``ids`` is invalid or has duplicates, the lengths differ, or a
                time is not finite.
            TypeError: an element of ``texts`` is not a ``str``.
        """
        id_list = _as_id_list(ids)
        if not len(times) == len(texts) == len(id_list):
            raise ValueError(f"got {len(id_list)} ids, {len(times)} times, {len(texts)} texts")
        if len(set(id_list)) != len(id_list):
            raise ValueError("ids must be distinct within one add")
        stamps = [float(t) for t in times]
        if not all(np.isfinite(stamps)):
            raise ValueError("times must be finite")
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be strings")
        scores = [time_expression_score(t) for t in texts]
        if not id_list:
            return
        new_i = np.asarray(id_list, np.int64)
        new_t = np.asarray(stamps, np.float64)
        with self._lock:
            self._drop(new_i)
            for id_, score in zip(id_list, scores, strict=True):
                if score > 0.0:
                    self._expr[id_] = score
            order = np.lexsort((new_i, new_t))
            at = _positions(self._t, self._i, new_t[order], new_i[order])
            self._t = np.insert(self._t, at, new_t[order])
            self._i = np.insert(self._i, at, new_i[order])
            order = np.argsort(new_i)
            at = np.searchsorted(self._by_id, new_i[order])
            self._by_id = np.insert(self._by_id, at, new_i[order])
            self._t_by_id = np.insert(self._t_by_id, at, new_t[order])

    def remove(self, ids: npt.ArrayLike) -> int:
        """Forget turns; absent ids are ignored.

        Args:
            ids: ``(n,)`` integers within int64.

        Returns:
            The number of ids removed.

        Raises:
            ValueError: ``ids`` is not 1-D integers within int64.
        """
        id_list = _as_id_list(ids)
        if not id_list:
            return 0
        with self._lock:
            return self._drop(np.unique(np.asarray(id_list, np.int64)))

    def _drop(self, ids: npt.NDArray[np.int64]) -> int:
        """Forget the held ones of ``ids`` (distinct); holds the lock. Returns how many."""
        at = np.searchsorted(self._by_id, ids)
        inside = at < len(self._by_id)
        held = np.zeros(len(ids), np.bool_)
        held[inside] = self._by_id[at[inside]] == ids[inside]
        if not held.any():
            return 0
        gone = ids[held]
        for id_ in gone.tolist():
            self._expr.pop(id_, None)
        keep = np.ones(len(self._by_id), np.bool_)
        keep[at[held]] = False
        self._by_id, self._t_by_id = self._by_id[keep], self._t_by_id[keep]
        keep = ~np.isin(self._i, gone)
        self._t, self._i = self._t[keep], self._i[keep]
        return len(gone)

    def years(self) -> range:
        """The calendar years (UTC) the held turns span; empty when none is held."""
        with self._lock:
            if not len(self._t):
                return range(0)
            first, last = float(self._t[0]), float(self._t[-1])
        return range(
            datetime.fromtimestamp(first, UTC).year, datetime.fromtimestamp(last, UTC).year + 1
        )

    def prior(self, query: str, candidates: Iterable[int]) -> list[tuple[int, float]]:
        """The time-expression prior: for a when-question, the candidates with a time expression.

        Args:
            query: The question (:func:`index._temporal.asks_when` decides).
            candidates: Ids found by the other legs.

        Returns:
            ``(id, score)`` for each held candidate with a time expression, best first,
            ties by ascending id; ``[]`` when the question does not ask when or how long.
        """
        if not asks_when(query):
            return []
        with self._lock:
            found = [(i, self._expr[i]) for i in set(candidates) if i in self._expr]
        return sorted(found, key=lambda hit: (-hit[1], hit[0]))

    def periods(self, query: str) -> list[NamedPeriod]:
        """The days, months and years ``query`` names; ``[]`` when it names none.

        A day or month named without a year counts in each year the held turns span.
        """
        return named_periods(query, self.years())

    def window(
        self,
        periods: Sequence[NamedPeriod],
        limit: int,
        slack: Mapping[str, float] = WINDOW_SLACK,
    ) -> list[tuple[int, float]]:
        """The turns said on or just after the named periods.

        A turn inside a period scores 1; one within ``slack[granularity]`` seconds after
        its end scores ``1 - (t - end) / slack`` (its best over all periods).

        Args:
            periods: Named periods (from :meth:`periods`); ``[]`` gives ``[]``.
            limit: At most this many turns, ``>= 1``: the best. When more than
                ``limit`` turns score, the turns whose score equals the one just past
                the cut are all left out: choosing among equal scores by time would
                hand a named year's weight to its earliest turns only.
            slack: Seconds after a period that still score, by granularity.

        Returns:
            ``(id, score in (0, 1])`` pairs, best first, then by time and id; ``[]``
            also when more than ``limit`` turns share the best score (the window then
            tells nothing apart).

        Raises:
            ValueError: ``limit < 1``.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if not periods:
            return []
        best: dict[int, tuple[float, float]] = {}  # id -> (score, time)
        with self._lock:
            times, ids = self._t, self._i
            for period in periods:
                tail = slack.get(period.granularity, 0.0)
                lo = int(np.searchsorted(times, period.start, "left"))
                hi = int(np.searchsorted(times, period.end + tail, "left"))
                for when, id_ in zip(times[lo:hi].tolist(), ids[lo:hi].tolist(), strict=True):
                    score = 1.0 if when < period.end else 1.0 - (when - period.end) / tail
                    if score > 0.0 and score > best.get(id_, (0.0, 0.0))[0]:
                        best[id_] = (score, when)
        ranked = sorted(best.items(), key=lambda item: (-item[1][0], item[1][1], item[0]))
        if len(ranked) > limit:
            edge = ranked[limit][1][0]
            ranked = [item for item in ranked[:limit] if item[1][0] > edge]
        return [(id_, score) for id_, (score, _) in ranked]

    def ids(self) -> npt.NDArray[np.int64]:
        """All ids held, ``(len(self),) int64`` ascending."""
        with self._lock:
            return self._by_id.copy()

    def nbytes(self) -> int:
        """An estimate of the bytes this index holds, for the index cache's bound. O(1).

        :data:`_TURN_BYTES` per turn (its time and id, in time order and in id
        order) and :data:`_EXPR_BYTES` per turn with a time expression, measured
        with ``tracemalloc`` (``tests/index/test_index_sessions.py`` checks it
        within 30 %).
        """
        with self._lock:
            return len(self._i) * _TURN_BYTES + len(self._expr) * _EXPR_BYTES

    def __len__(self) -> int:
        """Number of turns held."""
        with self._lock:
            return len(self._i)

    def to_state(self) -> State:
        """The whole index as a :data:`index.State` (see :mod:`index._state`).

        Returns:
            ``(meta, arrays)``: ``times`` ``(n,) float64`` and ``ids`` ``(n,) int64``
            in time order, and ``expr_ids`` ``(e,) int64`` with their scores
            ``expr_scores`` ``(e,) float64``.
        """
        with self._lock:
            e = len(self._expr)
            times, ids = self._t.copy(), self._i.copy()
            expr_ids = np.fromiter(self._expr.keys(), np.int64, count=e)
            expr_scores = np.fromiter(self._expr.values(), np.float64, count=e)
        meta: dict[str, Any] = {"kind": "TimeIndex"}
        return meta, {"times": times, "ids": ids, "expr_ids": expr_ids, "expr_scores": expr_scores}

    @classmethod
    def from_state(cls, state: State) -> TimeIndex:
        """The index :meth:`to_state` described.

        Raises:
            ValueError: The state is not a :meth:`to_state` of this version, or
                its parts disagree.
        """
        meta, arrays = state
        try:
            if meta["kind"] != "TimeIndex":
                raise ValueError(f"not a TimeIndex state: {meta['kind']!r}")
            times = np.array(arrays["times"], dtype=np.float64)
            ids = np.array(arrays["ids"], dtype=np.int64)
            expr = dict(
                zip(arrays["expr_ids"].tolist(), arrays["expr_scores"].tolist(), strict=True)
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed TimeIndex state: {exc!r}") from None
        if times.ndim != 1 or times.shape != ids.shape:
            raise ValueError("the TimeIndex state's parts disagree")
        order = np.argsort(ids, kind="stable")
        by_id = ids[order]
        if len(by_id) > 1 and bool((by_id[1:] == by_id[:-1]).any()):
            raise ValueError("the TimeIndex state's parts disagree")
        if expr and not bool(np.isin(np.fromiter(expr, np.int64, len(expr)), by_id).all()):
            raise ValueError("the TimeIndex state's parts disagree")
        if len(times) > 1 and not _in_order(times, ids):
            raise ValueError("the TimeIndex state is not in time order")
        out = cls()
        out._t, out._i, out._by_id, out._t_by_id = times, ids, by_id, times[order]
        out._expr = expr
        return out

    def __repr__(self) -> str:
        return f"TimeIndex(size={len(self)})"


def _in_order(times: npt.NDArray[np.float64], ids: npt.NDArray[np.int64]) -> bool:
    """Whether the pairs ``(times[k], ids[k])`` ascend (lexicographically)."""
    dt = np.diff(times)
    return bool(((dt > 0) | ((dt == 0) & (np.diff(ids) > 0))).all())


def _positions(
    times: npt.NDArray[np.float64],
    ids: npt.NDArray[np.int64],
    new_t: npt.NDArray[np.float64],
    new_i: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Where each ``(new_t[k], new_i[k])`` goes among ``(times, ids)`` ascending by (time, id).

    Positions index the arrays as they are (for ``np.insert``); no pair may be held.
    """
    lo = np.searchsorted(times, new_t, "left")
    hi = np.searchsorted(times, new_t, "right")
    at = lo.astype(np.int64)
    for k in np.flatnonzero(hi > lo).tolist():  # equal times: by id among them
        a, b = int(lo[k]), int(hi[k])
        at[k] = a + int(np.searchsorted(ids[a:b], new_i[k]))
    return at
