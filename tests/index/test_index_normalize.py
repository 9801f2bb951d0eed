"""Tests for index.normalize."""

import numpy as np
import pytest

from index import DimensionMismatchError, InvalidVectorError, normalize


def test_normalize_1d_returns_one_unit_row() -> None:
    out = normalize([3.0, 4.0])
    assert out.shape == (1, 2)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    np.testing.assert_allclose(out, [[0.6, 0.8]], rtol=1e-6)


def test_normalize_2d_rows_have_unit_norm() -> None:
    rng = np.random.default_rng(0)
    out = normalize(rng.normal(size=(5, 7)) * 1000.0, dim=7)
    assert out.shape == (5, 7)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)


def test_normalize_accepts_integers_and_extreme_finite_values() -> None:
    np.testing.assert_allclose(normalize([0, 2]), [[0.0, 1.0]])
    np.testing.assert_allclose(normalize([1e300, 1e300]), [[2**-0.5, 2**-0.5]], rtol=1e-6)
    np.testing.assert_allclose(normalize([1e-300, 0.0]), [[1.0, 0.0]])


def test_normalize_empty_batch_keeps_dim() -> None:
    assert normalize(np.zeros((0, 4)), dim=4).shape == (0, 4)


def test_normalize_rejects_nan() -> None:
    with pytest.raises(InvalidVectorError):
        normalize([1.0, float("nan")])


def test_normalize_rejects_inf() -> None:
    with pytest.raises(InvalidVectorError):
        normalize([[1.0, 0.0], [float("-inf"), 0.0]])


def test_normalize_rejects_zero_norm_row() -> None:
    with pytest.raises(InvalidVectorError, match="zero-norm"):
        normalize([[1.0, 0.0], [0.0, 0.0]])


def test_normalize_rejects_0d() -> None:
    with pytest.raises(InvalidVectorError, match="ndim"):
        normalize(1.0)


def test_normalize_rejects_3d() -> None:
    with pytest.raises(InvalidVectorError, match="ndim"):
        normalize(np.ones((2, 2, 2)))


def test_normalize_rejects_strings() -> None:
    with pytest.raises(InvalidVectorError):
        normalize(["a", "b"])


def test_normalize_rejects_ragged_rows() -> None:
    with pytest.raises(InvalidVectorError):
        normalize([[1.0, 2.0], [1.0]])


def test_normalize_wrong_dim_raises_dimension_mismatch() -> None:
    with pytest.raises(DimensionMismatchError) as info:
        normalize(np.ones((2, 3)), dim=4)
    assert (info.value.expected, info.value.actual) == (4, 3)
