"""Fusion of ranked lists from several retrieval legs (dense, lexical, contextual, session, time).

Every function here is pure: it takes ranked lists ``list[tuple[int, float]]`` (id,
score; best first, ids distinct within a list) and returns one such list, best first,
ties broken by ascending id so results are deterministic.

- :func:`convex_fusion` — a weighted sum of per-leg scores after min-max normalisation,
  the "convex combination" of Bruch, Gai and Ingber, "An Analysis of Fusion Functions for
  Hybrid Retrieval", ACM TOIS 42(1), 2023, who found it beats RRF when the weights are
  tuned on a little labelled data. A leg may fix its theoretical lower bound (their
  "TM2C2" normalisation: 0 for BM25, -1 for cosine) instead of the observed minimum.
- :func:`rrf` — weighted reciprocal-rank fusion, ``sum_i w_i / (k + rank_i)`` with
  ``rank`` starting at 1 (Cormack, Clarke and Büttcher, "Reciprocal Rank Fusion
  Outperforms Condorcet and Individual Rank Learning Methods", SIGIR 2009; ``k = 60``
  there).

The chosen default (:data:`HYBRID_WEIGHTS`, :data:`HYBRID_LOWER_BOUNDS`) was tuned by grid search
on LoCoMo conversations 1-5 (conv-26 ... conv-43, categories 1-4) with
``bench/eval_retrieval.py`` and reported on conversations 6-10 and on all ten there.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "HYBRID_LOWER_BOUNDS",
    "HYBRID_SESSIONS",
    "HYBRID_TUNED_WEIGHTS",
    "HYBRID_WEIGHTS",
    "convex_fusion",
    "rrf",
]

Ranked = list[tuple[int, float]]

HYBRID_TUNED_WEIGHTS: tuple[float, float, float, float, float, float] = (
    0.25,
    0.1,
    0.55,
    0.45,
    0.6,
    0.35,
)
"""The grid weights ``bench/eval_retrieval.py`` chose on conversations 1-5, before scaling.

Legs, in order: dense (WordLlama cosine over ``"speaker: text"``); lexical (BM25 over
the same text); contextual lexical (BM25 over ``"{date}. {previous turn} {speaker:
text}"``); session (:class:`index.SessionIndex`: the members of the best
:data:`HYBRID_SESSIONS` sessions with their session's BM25 score); time-expression
prior (:meth:`index.TimeIndex.prior`, when-questions only); session-date window
(:meth:`index.TimeIndex.window`, questions naming a date only). The first three legs
are cut at depth 30 before fusion. Coordinate search from the earlier three-leg
weights (0.2, 0.2, 0.6), steps 0.05-0.2, objective the sum of recall@1/5/10/20 on
conversations 1-5 (categories 1-4). Measured (``bench/eval_retrieval.py``, WordLlama):
recall@1/5/10/20 0.417/0.674/0.753/0.808 on 1-5, 0.361/0.650/0.728/0.781 on the
held-out 6-10, 0.389/0.662/0.741/0.794 on all ten (three legs: 0.350/0.617/0.700/0.766).
"""

HYBRID_WEIGHTS: tuple[float, ...] = tuple(
    w / sum(HYBRID_TUNED_WEIGHTS) for w in HYBRID_TUNED_WEIGHTS
)
""":data:`HYBRID_TUNED_WEIGHTS` scaled to sum to 1 (same ranking; fused scores in ``[0, 1]``)."""

HYBRID_LOWER_BOUNDS: tuple[float | None, ...] = (None, 0.0, 0.0, 0.0, 0.0, 0.0)
"""Min-max lower bounds of the legs (dense cosine: observed minimum; BM25 and the time
legs: 0)."""

HYBRID_SESSIONS = 5
"""How many of the best sessions hand their members to the session leg (tuned with the
weights, from 1-5: more cost latency, see ``bench/eval_retrieval.py``)."""


def _check(legs: Sequence[Ranked], weights: Sequence[float]) -> None:
    if len(legs) != len(weights):
        raise ValueError(f"got {len(weights)} weights for {len(legs)} legs")
    if any(not w >= 0.0 for w in weights):
        raise ValueError("weights must be >= 0")


def _ordered(fused: dict[int, float], k: int | None) -> Ranked:
    # Sorting (-score, id) tuples compares in C: no key function call per item.
    keyed = sorted([(-score, id_) for id_, score in fused.items()])
    if k is not None:
        keyed = keyed[:k]
    return [(id_, -neg) for neg, id_ in keyed]


def convex_fusion(
    legs: Sequence[Ranked],
    weights: Sequence[float],
    lower_bounds: Sequence[float | None] | None = None,
    k: int | None = None,
) -> Ranked:
    """Fuse legs by a weighted sum of min-max normalised scores.

    Each leg's scores are mapped to ``(s - lo) / (hi - lo)`` where ``hi`` is the leg's
    best score and ``lo`` its lower bound (or its worst listed score when the bound is
    ``None``); a leg whose scores are all equal maps them to 1. An id missing from a
    leg gets 0 from it. A leg with weight 0 contributes nothing, but its ids still enter
    the result (with whatever the other legs give them).

    Args:
        legs: Ranked lists ``(id, score)``, best first, ids distinct within a list.
        weights: One weight ``>= 0`` per leg (they need not sum to 1).
        lower_bounds: One lower bound per leg, or ``None`` for all observed minima.
        k: Keep at most this many results; ``None`` keeps all.

    Returns:
        ``(id, fused score)`` over the union of ids, best first, ties by ascending id.
        Fused scores lie in ``[0, sum(weights)]``.

    Raises:
        ValueError: ``weights`` or ``lower_bounds`` has the wrong length, or a weight is
            negative or NaN.
    """
    _check(legs, weights)
    bounds: Sequence[float | None] = [None] * len(legs) if lower_bounds is None else lower_bounds
    if len(bounds) != len(legs):
        raise ValueError(f"got {len(bounds)} lower bounds for {len(legs)} legs")
    fused: dict[int, float] = {}
    get = fused.get
    for leg, weight, bound in zip(legs, weights, bounds, strict=True):
        if not leg:
            continue
        scores = [s for _, s in leg]
        hi = max(scores)
        lo = min(scores) if bound is None else min(bound, min(scores))
        span = hi - lo
        if span > 0.0:
            scale = weight / span
            for id_, score in leg:
                fused[id_] = get(id_, 0.0) + (score - lo) * scale
        else:
            for id_, _ in leg:
                fused[id_] = get(id_, 0.0) + weight
    return _ordered(fused, k)


def rrf(
    legs: Sequence[Ranked],
    weights: Sequence[float] | None = None,
    k0: float = 60.0,
    k: int | None = None,
) -> Ranked:
    """Fuse legs by weighted reciprocal rank: ``score(d) = sum_i w_i / (k0 + rank_i(d))``.

    Args:
        legs: Ranked lists ``(id, score)``, best first; only the order is used.
        weights: One weight ``>= 0`` per leg; ``None`` gives every leg weight 1.
        k0: Rank offset ``> 0`` (60 in Cormack et al. 2009).
        k: Keep at most this many results; ``None`` keeps all.

    Returns:
        ``(id, fused score)`` over the union of ids, best first, ties by ascending id.

    Raises:
        ValueError: ``weights`` has the wrong length or a negative/NaN weight, or
            ``k0 <= 0``.
    """
    w = [1.0] * len(legs) if weights is None else list(weights)
    _check(legs, w)
    if not k0 > 0.0:
        raise ValueError(f"k0 must be > 0, got {k0}")
    fused: dict[int, float] = {}
    for leg, weight in zip(legs, w, strict=True):
        for rank, (id_, _) in enumerate(leg, start=1):
            fused[id_] = fused.get(id_, 0.0) + weight / (k0 + rank)
    return _ordered(fused, k)
