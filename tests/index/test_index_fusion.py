"""Tests for index.convex_fusion and index.rrf."""

import pytest

from index import (
    HYBRID_LOWER_BOUNDS,
    HYBRID_TUNED_WEIGHTS,
    HYBRID_WEIGHTS,
    convex_fusion,
    rrf,
)

DENSE = [(1, 0.9), (2, 0.5), (3, 0.1)]
LEXICAL = [(1, 12.0), (4, 6.0), (2, 3.0)]


def test_doc_first_in_both_legs_is_first() -> None:
    assert convex_fusion([DENSE, LEXICAL], [0.5, 0.5])[0][0] == 1
    assert rrf([DENSE, LEXICAL])[0][0] == 1


def test_weight_zero_one_reduces_to_a_single_leg_order() -> None:
    only_lexical = convex_fusion([DENSE, LEXICAL], [0.0, 1.0], [None, 0.0])
    assert [i for i, _ in only_lexical][:3] == [1, 4, 2]
    only_dense = convex_fusion([DENSE, LEXICAL], [1.0, 0.0])
    assert [i for i, _ in only_dense][:3] == [1, 2, 3]
    assert [i for i, _ in rrf([DENSE, LEXICAL], [1.0, 0.0])][:3] == [1, 2, 3]


def test_convex_scores_are_weighted_min_max() -> None:
    fused = dict(convex_fusion([DENSE, LEXICAL], [0.25, 0.75], [None, 0.0]))
    assert fused[1] == pytest.approx(0.25 * 1.0 + 0.75 * 1.0)
    assert fused[2] == pytest.approx(0.25 * 0.5 + 0.75 * 0.25)
    assert fused[3] == pytest.approx(0.0)
    assert fused[4] == pytest.approx(0.75 * 0.5)


def test_rrf_scores_follow_cormack_formula() -> None:
    fused = dict(rrf([DENSE, LEXICAL], [1.0, 2.0], k0=60.0))
    assert fused[2] == pytest.approx(1 / 62 + 2 / 63)
    assert fused[4] == pytest.approx(2 / 62)


def test_ties_break_by_ascending_id_and_k_truncates() -> None:
    fused = rrf([[(5, 1.0)], [(3, 1.0)]], k=1)
    assert [i for i, _ in fused] == [3]
    assert fused[0][1] == pytest.approx(1 / 61)


def test_empty_legs_and_equal_scores() -> None:
    assert convex_fusion([[], []], [0.5, 0.5]) == []
    assert convex_fusion([[(7, 2.0), (8, 2.0)], []], [1.0, 1.0]) == [(7, 1.0), (8, 1.0)]


def test_bad_weights_are_rejected() -> None:
    with pytest.raises(ValueError, match="weights for"):
        convex_fusion([DENSE, LEXICAL], [1.0])
    with pytest.raises(ValueError, match=">= 0"):
        rrf([DENSE, LEXICAL], [1.0, -1.0])
    with pytest.raises(ValueError, match="lower bounds"):
        convex_fusion([DENSE, LEXICAL], [1.0, 1.0], [0.0])
    with pytest.raises(ValueError, match="k0"):
        rrf([DENSE], k0=0.0)


def test_shipped_hybrid_defaults_have_six_legs() -> None:
    assert len(HYBRID_WEIGHTS) == len(HYBRID_LOWER_BOUNDS) == len(HYBRID_TUNED_WEIGHTS) == 6
    assert sum(HYBRID_WEIGHTS) == pytest.approx(1.0)
    ratios = [w / t for w, t in zip(HYBRID_WEIGHTS, HYBRID_TUNED_WEIGHTS, strict=True)]
    assert ratios == pytest.approx([ratios[0]] * 6)  # scaling keeps the tuned ranking


def test_an_empty_leg_changes_nothing() -> None:
    """A heuristic leg that matches no question is [] and must not act as a filter."""
    with_empty = convex_fusion([DENSE, LEXICAL, []], [0.5, 0.5, 0.4], [None, 0.0, 0.0])
    assert with_empty == convex_fusion([DENSE, LEXICAL], [0.5, 0.5], [None, 0.0])
