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
leg, never a filter. The index holds one float and one flag per id, no text.

Threads: any thread may call any method; one mutex guards the index.
:meth:`TimeIndex.to_state` and :meth:`TimeIndex.from_state` hand its whole state to a
caller that keeps it (Lethe's encrypted index snapshots) and make it again.
"""

from __future__ import annotations

import bisect
import itertools
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

_TURN_BYTES = 125
"""Estimated bytes per held turn (see :meth:`TimeIndex.nbytes`)."""
_EXPR_BYTES = 50
"""Estimated bytes per held turn with a time expression."""

WINDOW_DEPTH = 200
"""Most turns the session-date window leg hands to the fusion (a group of equal scores
that this cut would split is left out whole: :meth:`TimeIndex.window`)."""


class TimeIndex:
    """Turn times and time-expression flags keyed by int64 ids, held only in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._time: dict[int, float] = {}  # id -> seconds since the epoch
        self._expr: dict[int, float] = {}  # id -> time-expression score (> 0 only)
        self._order: list[tuple[float, int]] = []  # (time, id), ascending

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
        with self._lock:
            for id_, when, score in zip(id_list, stamps, scores, strict=True):
                self._drop(id_)
                self._time[id_] = when
                if score > 0.0:
                    self._expr[id_] = score
                bisect.insort(self._order, (when, id_))

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
        with self._lock:
            return sum(self._drop(i) for i in set(id_list))

    def _drop(self, id_: int) -> int:
        when = self._time.pop(id_, None)
        if when is None:
            return 0
        self._expr.pop(id_, None)
        at = bisect.bisect_left(self._order, (when, id_))
        del self._order[at]
        return 1

    def years(self) -> range:
        """The calendar years (UTC) the held turns span; empty when none is held."""
        with self._lock:
            if not self._order:
                return range(0)
            first, last = self._order[0][0], self._order[-1][0]
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
            order = self._order
            for period in periods:
                tail = slack.get(period.granularity, 0.0)
                lo = bisect.bisect_left(order, (period.start, -(2**63)))
                hi = bisect.bisect_left(order, (period.end + tail, -(2**63)))
                for when, id_ in order[lo:hi]:
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
            held = np.fromiter(self._time.keys(), dtype=np.int64, count=len(self._time))
        return np.sort(held)

    def nbytes(self) -> int:
        """An estimate of the bytes this index holds, for the index cache's bound. O(1).

        :data:`_TURN_BYTES` per turn (its time entry and its ``(time, id)`` tuple in
        the ordered list) and :data:`_EXPR_BYTES` per turn with a time expression,
        measured with ``tracemalloc`` on the LoCoMo turns
        (``tests/index/test_index_sessions.py`` checks it within 30 %).
        """
        with self._lock:
            return len(self._time) * _TURN_BYTES + len(self._expr) * _EXPR_BYTES

    def __len__(self) -> int:
        """Number of turns held."""
        with self._lock:
            return len(self._time)

    def to_state(self) -> State:
        """The whole index as a :data:`index.State` (see :mod:`index._state`).

        Returns:
            ``(meta, arrays)``: ``times`` ``(n,) float64`` and ``ids`` ``(n,) int64``
            in time order, and ``expr_ids`` ``(e,) int64`` with their scores
            ``expr_scores`` ``(e,) float64``.
        """
        with self._lock:
            n, e = len(self._order), len(self._expr)
            times = np.fromiter((t for t, _ in self._order), np.float64, count=n)
            ids = np.fromiter((i for _, i in self._order), np.int64, count=n)
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
            times, ids = arrays["times"].tolist(), arrays["ids"].tolist()
            expr = dict(
                zip(arrays["expr_ids"].tolist(), arrays["expr_scores"].tolist(), strict=True)
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed TimeIndex state: {exc!r}") from None
        out = cls()
        out._order = list(zip(times, ids, strict=True))
        out._time = dict(zip(ids, times, strict=True))
        if len(out._time) != len(ids) or not expr.keys() <= out._time.keys():
            raise ValueError("the TimeIndex state's parts disagree")
        if any(a > b for a, b in itertools.pairwise(out._order)):
            raise ValueError("the TimeIndex state is not in time order")
        out._expr = expr
        return out

    def __repr__(self) -> str:
        return f"TimeIndex(size={len(self)})"
