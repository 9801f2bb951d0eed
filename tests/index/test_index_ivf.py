"""VectorIndex past its IVF threshold: recall, exact forgetting, re-layout, random data stays exact.

The threshold is a small ``ivf_min`` here (50,000 in the server). Vectors with
cluster structure move to an inverted file whose recall@10 against exact search
is at least 0.99, forgetting stays exact (a removed id is never returned, by
any k), the layout is chosen again at each doubling, and vectors without
structure (random) stay exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from index import VectorIndex
from index._vectors import choose_layout

D = 32


def _clustered(n: int, seed: int, clusters: int = 60) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, D)).astype(np.float32)
    x = centres[rng.integers(0, clusters, n)] + 0.15 * rng.standard_normal((n, D))
    out: npt.NDArray[np.float32] = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return out


def _exact(
    x: npt.NDArray[np.float32], ids: npt.NDArray[np.int64], q: npt.NDArray[np.float32], k: int
) -> list[set[int]]:
    scores = q @ x.T
    return [set(ids[np.argsort(-row)[:k]].tolist()) for row in scores]


def _filled(x: npt.NDArray[np.float32], ivf_min: int, chunk: int = 1000) -> VectorIndex:
    index = VectorIndex(D, ivf_min=ivf_min)
    for start in range(0, len(x), chunk):
        index.add(np.arange(start, min(start + chunk, len(x))) + 1, x[start : start + chunk])
    return index


def test_clustered_vectors_move_to_an_ivf_with_recall_at_least_099() -> None:
    x = _clustered(6000, 1)
    index = _filled(x, ivf_min=3000)
    factory, params = index.layout
    assert factory.startswith("IVF")
    assert params.startswith("nprobe=")
    assert len(index) == 6000
    assert index.ids().tolist() == list(range(1, 6001))
    q = _clustered(300, 2)  # other points of the same clusters
    exact = _exact(x, np.arange(1, 6001), q, 10)
    got = [{i for i, _ in index.search(v, 10)} for v in q]
    recall = np.mean([len(a & b) / 10 for a, b in zip(got, exact, strict=True)])
    assert recall >= 0.99


def test_removed_ids_are_never_returned_by_an_ivf_at_any_k() -> None:
    x = _clustered(4000, 3)
    index = _filled(x, ivf_min=2000)
    assert index.layout[0].startswith("IVF")
    gone = np.arange(1, 4001, 3)
    assert index.remove(gone) == len(gone)
    assert len(index) == 4000 - len(gone)
    assert set(index.ids().tolist()).isdisjoint(gone.tolist())
    for k in (10, 500, 4000):  # probed lists, and every list from a quarter on
        for v in x[:40]:
            found = [i for i, _ in index.search(v, k)]
            assert set(found).isdisjoint(gone.tolist())
    # Every list once a quarter of the index is asked for: exactly the visible ones.
    everything = {i for i, _ in index.search(x[0], 4000)}
    assert everything == set(range(1, 4001)) - set(gone.tolist())


def test_re_adding_an_id_in_an_ivf_replaces_its_vector() -> None:
    x = _clustered(4000, 4)
    index = _filled(x, ivf_min=2000)
    assert index.layout[0].startswith("IVF")
    index.add([7], x[3999][None, :])
    assert len(index) == 4000
    top = index.search(x[3999], 2)
    assert {i for i, _ in top} == {7, 4000}
    assert top[0][1] == pytest.approx(1.0, abs=1e-5)


def test_the_layout_is_chosen_again_at_each_doubling() -> None:
    x = _clustered(9000, 5)
    index = VectorIndex(D, ivf_min=2000)
    index.add(np.arange(1, 2001), x[:2000])
    first = index.layout
    index.add(np.arange(2001, 3901), x[2000:3900])  # < 2 x 2000: unchanged
    assert index.layout == first
    index.add(np.arange(3901, 9001), x[3900:])  # 9000 >= 2 x 2000: chosen again
    assert index.layout != first
    assert int(index.layout[0][3:].split(",")[0]) == int(2 * np.sqrt(9000))


def test_vectors_without_structure_stay_exact() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5000, D)).astype(np.float32)
    index = _filled(x, ivf_min=2000)
    assert index.layout == ("IDMap2,Flat", "")
    assert choose_layout(x / np.linalg.norm(x, axis=1, keepdims=True), np.arange(5000)) is None
    v = x[17] / np.linalg.norm(x[17])
    assert index.search(v, 1)[0][0] == 18


def test_ivf_min_zero_keeps_exact_search() -> None:
    index = _filled(_clustered(3000, 7), ivf_min=0)
    assert index.layout == ("IDMap2,Flat", "")
    with pytest.raises(ValueError, match="ivf_min"):
        VectorIndex(D, ivf_min=-1)


def _rows_in(view: npt.NDArray[np.float32], vec: npt.NDArray[np.float32]) -> int:
    return int(np.sum(np.all(np.isclose(view, vec, atol=1e-7), axis=1)))


@pytest.mark.parametrize("layout", ["flat", "ivf"])
def test_a_removed_vector_leaves_no_copy_in_faiss_memory(layout: str) -> None:
    """Views taken before a removal see the whole buffers, yet hold none of the removed rows.

    A shrinking std::vector keeps its allocation, so the views still see the
    whole buffers: none of them holds the removed rows after.
    """
    import faiss

    x = _clustered(4000, 8)
    index = _filled(x, ivf_min=2000 if layout == "ivf" else 0)
    assert index.layout[0].startswith("IVF" if layout == "ivf" else "IDMap2")
    gone = [1, 2000, 3999, 4000]  # first, middle and the last rows
    inner: Any = index._index  # white box: the FAISS index behind the lock
    if layout == "flat":
        flat = inner  # an IndexFlatIP under the index's own id map
        views = [faiss.rev_swig_ptr(flat.get_xb(), 4000 * D).reshape(4000, D)]
    else:
        lists: Any = faiss.extract_index_ivf(inner).invlists
        views = [
            np.frombuffer(
                faiss.rev_swig_ptr(lists.get_codes(i), lists.list_size(i) * D * 4), np.float32
            ).reshape(-1, D)
            for i in range(lists.nlist)
            if lists.list_size(i)
        ]
    stored = [index.search(x[i - 1], 1)[0] for i in gone]
    assert [i for i, _ in stored] == gone
    before = sum(_rows_in(v, x[gone[0] - 1] / np.linalg.norm(x[gone[0] - 1])) for v in views)
    assert before == 1
    index.remove(gone)
    for i in gone:
        unit = x[i - 1] / np.linalg.norm(x[i - 1])
        assert sum(_rows_in(v, unit) for v in views) == 0, i
    assert len(index) == 3996
