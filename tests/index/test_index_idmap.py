"""index.IdMap (the bundle's context map, VectorIndex's positions) against a plain dict."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index import IdMap

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 40), st.integers(0, 40)),
        st.tuples(st.just("del"), st.integers(0, 40), st.just(0)),
    ),
    max_size=80,
)


@settings(max_examples=100, deadline=None)
@given(start=st.dictionaries(st.integers(0, 40), st.integers(0, 40)), ops=_ops)
def test_a_rid_map_follows_any_sets_and_deletes_as_a_dict(
    start: dict[int, int], ops: list[tuple[str, int, int]]
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(IdMap, "MERGE_MIN", 3)  # merges often
        got, want = IdMap(start.keys(), start.values()), dict(start)
        for op, key, value in ops:
            if op == "set":
                got[key] = value
                want[key] = value
            elif key in want:
                assert got.pop(key) == want.pop(key)
            else:
                assert got.pop(key, None) is None
            assert len(got) == len(want)
        assert dict(got) == want
        assert got.items() == sorted(want.items())
        assert all((k in got) == (k in want) for k in range(42))
        rids = {1, 2, 3}
        assert got.quoting(rids) == sorted(
            k for k, v in want.items() if v in rids and k not in rids
        )
        keys, values = got.arrays()
        assert dict(zip(keys.tolist(), values.tolist(), strict=True)) == want


def test_a_rid_map_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="twice"):
        IdMap([1, 1], [0, 0])
    with pytest.raises(ValueError, match=">= 0"):
        IdMap([1], [-1])
    with pytest.raises(ValueError, match="differ"):
        IdMap([1, 2], [0])
    m = IdMap()
    with pytest.raises(ValueError, match=">= 0"):
        m[5] = -1
    with pytest.raises(KeyError):
        del m[5]
