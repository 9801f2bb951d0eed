"""Index upkeep after an append, in process on a real store and keystore.

An append hands what it sealed to ``Retriever.on_write`` instead of reading it
back, and the loaded bundle ends up equal to one built from LMDB — the same
contextual texts quoting the same turns, the same vectors — while a turn
forgotten between its write and the upkeep never enters the index, and an
append of n turns into a long thread reads O(1) rows to find the neighbours (it
read every new turn's row twice and decrypted every new turn again).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index import analyze
from lethe.locomo import load_locomo
from server._metrics import Metrics
from server.lifecycle import Lifecycle
from server.retrieval import Retriever, TermMemo, date_text, plain_text, session_key
from server.store import ForgetTargets, Store, TurnDraft, TurnMeta

OWNER, THREAD, D = "alice", "t1", 16
# ctx_prev, lexical scores, held ids, dense scores, session and time leg sizes
Legs = tuple[dict[int, int], Any, tuple[int, ...], Any, int, int]
QUERIES = ["turn about apples", "the weather today", "zebra 17", "pears and plums 3"]


@pytest.fixture
def parts(tmp_path: Path, kek_env: str) -> Iterator[tuple[Store, Retriever, Lifecycle]]:
    store = Store(tmp_path / "d")
    retriever = Retriever(store, None)
    yield store, retriever, Lifecycle(store, retriever, Metrics(), rotation_interval=0.0)
    store.close()


def _drafts(start: int, n: int, rng: np.random.Generator, commit: bool = True) -> list[TurnDraft]:
    words = ["apples", "weather", "zebra", "pears", "plums", "today"]
    out = []
    for i in range(start, start + n):
        vec = rng.standard_normal(D).astype(np.float32)
        text = f"turn {i} about {words[i % 6]} and {words[(i * 7) % 6]} {i % 23}"
        out.append(TurnDraft(1, "ann", text, None, vec, "", [], commit, 3600.0))
    return out


def _append(
    store: Store, retriever: Retriever, drafts: list[TurnDraft], *, upkeep: bool = True
) -> list[TurnMeta]:
    """What ``AppendTurns`` does: count the removals, store the turns, hand them to the index."""
    removals = retriever.removals(OWNER)
    metas, _, _ = store.append_turns(OWNER, THREAD, drafts, "")
    if upkeep:
        _upkeep(retriever, metas, drafts, removals)
    return metas


def _upkeep(
    retriever: Retriever, metas: list[TurnMeta], drafts: list[TurnDraft], removals: int | None
) -> None:
    written = {
        m.rid: (plain_text(d.speaker, d.text), d.embedding)
        for m, d in zip(metas, drafts, strict=True)
    }
    retriever.on_write(OWNER, metas, written, removals)


def _legs(retriever: Retriever) -> Legs:
    """What the owner's loaded bundle answers, leg by leg.

    Contextual-text quotes, lexical scores of both BM25 legs, held vectors,
    session and time legs' sizes.
    """
    b = retriever.owner_bundle(OWNER)
    lex = tuple(
        tuple(sorted((r, round(s, 5)) for r, s in leg.search_terms(analyze(q), 500)))
        for leg in (b.plain, b.ctx)
        for q in QUERIES
    )
    ids = b.dense.ids()
    probe = np.ones(D, np.float32)
    return (
        dict(b.ctx_prev),
        lex,
        tuple(ids.tolist()),
        tuple(b.dense.search(probe, len(ids))),
        len(b.sessions),
        len(b.times),
    )


def _rebuilt(retriever: Retriever) -> Legs:
    retriever.cache.evict(f"o/{OWNER}")
    return _legs(retriever)


def test_appends_into_a_loaded_bundle_equal_a_build_from_lmdb(
    parts: tuple[Store, Retriever, Lifecycle],
) -> None:
    store, retriever, lifecycle = parts
    rng = np.random.default_rng(1)
    store.create_thread(OWNER, THREAD, "")
    _append(store, retriever, _drafts(1, 30, rng))
    retriever.owner_bundle(OWNER)  # loaded: later appends go through on_write
    _append(store, retriever, _drafts(31, 40, rng))
    pending = _append(store, retriever, _drafts(71, 5, rng, commit=False))
    _append(store, retriever, _drafts(76, 10, rng))
    lifecycle.forget(
        OWNER, ForgetTargets.of(turns=[(THREAD, 80)])
    )  # the turn after it needs a new context
    _append(store, retriever, _drafts(86, 7, rng))
    # Committing pending turns in the middle of the thread: no texts in hand.
    committed = store.commit_records([m.name for m in pending[1:4]], include_sources=False)
    retriever.on_write(OWNER, committed)
    incremental = _legs(retriever)
    assert len(incremental[2]) == 30 + 40 + 10 - 1 + 7 + 3
    assert incremental[0][pending[1].rid] == pending[0].rid - 1  # 71 pending: quotes 70
    assert retriever.index_drift(OWNER) == 0
    assert incremental == _rebuilt(retriever)


@pytest.mark.parametrize("counted", [True, False])
def test_a_turn_forgotten_before_the_upkeep_never_enters_the_index(
    parts: tuple[Store, Retriever, Lifecycle], counted: bool
) -> None:
    store, retriever, lifecycle = parts
    rng = np.random.default_rng(2)
    store.create_thread(OWNER, THREAD, "")
    _append(store, retriever, _drafts(1, 10, rng))
    retriever.owner_bundle(OWNER)
    drafts = _drafts(11, 3, rng)
    drafts[1].text = "the quixotic zebra password"
    removals = retriever.removals(OWNER) if counted else None
    metas = _append(store, retriever, drafts, upkeep=False)
    lifecycle.forget(
        OWNER, ForgetTargets.of(turns=[(THREAD, 12)])
    )  # on_forget runs, finds nothing loaded
    _upkeep(retriever, metas, drafts, removals)  # the append's upkeep comes last
    bundle = retriever.owner_bundle(OWNER)
    gone = metas[1].rid
    assert gone not in bundle.dense.ids().tolist()
    assert gone not in bundle.plain
    assert gone not in bundle.ctx
    assert bundle.plain.search_terms(analyze("quixotic"), 10) == []
    assert bundle.ctx.search_terms(analyze("quixotic"), 10) == []
    assert bundle.ctx_prev[metas[2].rid] == metas[0].rid  # 13 quotes 11, not 12
    assert retriever.index_drift(OWNER) == 0


def test_an_append_into_a_long_thread_reads_a_bounded_number_of_rows(
    parts: tuple[Store, Retriever, Lifecycle], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, retriever, _ = parts
    rng = np.random.default_rng(3)
    store.create_thread(OWNER, THREAD, "")
    _append(store, retriever, _drafts(1, 300, rng))
    retriever.owner_bundle(OWNER)
    reads = opened = 0
    real_read, real_open = store._turn_read, store.open_turn_payload

    def counting_read(*args: object) -> TurnMeta | None:
        nonlocal reads
        reads += 1
        return real_read(*args)  # type: ignore[arg-type]

    def counting_open(*args: object) -> bytes:
        nonlocal opened
        opened += 1
        return real_open(*args)  # type: ignore[arg-type]

    drafts = _drafts(301, 200, rng)
    removals = retriever.removals(OWNER)
    metas, _, _ = store.append_turns(OWNER, THREAD, drafts, "")
    monkeypatch.setattr(store, "_turn_read", counting_read)
    monkeypatch.setattr(store, "open_turn_payload", counting_open)
    _upkeep(retriever, metas, drafts, removals)
    assert reads <= 8  # the run's two ends, not 4 x 200; nothing removed: no reread
    assert opened <= 2  # the content of turn 300 (quoted by 301), nothing of the new ones
    assert len(retriever.owner_bundle(OWNER).dense) == 500


@settings(max_examples=500, deadline=None)
@given(
    st.floats(min_value=-1e10, max_value=4e9, allow_nan=False)
    | st.integers(-100_000, 50_000).flatmap(
        lambda d: st.floats(d * 86400.0 - 2e-6, d * 86400.0 + 2e-6)  # around midnight
    )
)
def test_the_cached_day_texts_equal_the_datetime_formatting(seconds: float) -> None:
    when = datetime.fromtimestamp(seconds, tz=UTC)
    assert date_text(seconds) == f"{when.day} {when.strftime('%B %Y')}"
    meta = TurnMeta(
        rid=1,
        owner=OWNER,
        thread=THREAD,
        seq=1,
        role=1,
        state="COMMITTED",
        version=1,
        time=seconds,
        create_time=0.0,
        expire_time=0.0,
        key_id="k",
    )
    assert session_key(meta) == f"{THREAD}/{when:%Y-%m-%d}"


def _contextual_text(seconds: float, prev: str, text: str) -> str:
    """The contextual text the contextual leg analysed before ``TermMemo``."""
    return f"{date_text(seconds)}. {prev} {text}".replace("  ", " ")


# Parts with what could cross a boundary: word characters at both ends, a final
# sigma (decided by what follows it), case-ignorable marks, the dotted capital I
# whose lower case is two code points, stopwords and stems.
_EDGES = "aZ9_ \u03a3\u03c3\u03c2\u0391'.\u00b7\u0301\u0130\u0131\u017f\u212a\u00e9-\n"
_PART = st.text(
    st.sampled_from(list(_EDGES)) | st.characters(),
    max_size=30,
) | st.sampled_from(["", "running dogs", "ΟΔΟΣ", "ΟΔΟΣ'", "'Σα", "the and of", "x"])


@settings(max_examples=800, deadline=None)
@given(st.floats(min_value=0.0, max_value=4e9), _PART, _PART)
def test_contextual_terms_from_the_parts_equal_the_analysis_of_the_joined_text(
    seconds: float, prev: str, text: str
) -> None:
    memo = TermMemo()
    assert memo.contextual(seconds, prev, text) == analyze(_contextual_text(seconds, prev, text))
    assert memo.terms(text) == analyze(text)


def test_contextual_terms_equal_the_joined_analysis_on_every_locomo_turn_pair(
    locomo_path: Path,
) -> None:
    texts = [
        plain_text(speaker, t)
        for conv in load_locomo(locomo_path)
        for s in conv.sessions.values()
        for speaker, _, t in s
    ]
    assert len(texts) > 5000
    memo = TermMemo()
    for i, text in enumerate(texts):
        prev = texts[i - 1] if i else ""
        when = 1.6e9 + 3600.0 * i
        assert memo.contextual(when, prev, text) == analyze(_contextual_text(when, prev, text))


def test_index_drift_counts_each_kind_of_disagreement_with_the_store(
    parts: tuple[Store, Retriever, Lifecycle],
) -> None:
    """The audit's count, read from the store a row at a time (``RowFacts``), sees every leg.

    Each change below is made to the loaded bundle only, so the store disagrees
    with it by exactly one more entry (two for a session member, which the
    time leg also holds it).
    """
    store, retriever, _ = parts
    rng = np.random.default_rng(3)
    store.create_thread(OWNER, THREAD, "")
    metas = _append(store, retriever, _drafts(1, 30, rng))
    bundle = retriever.owner_bundle(OWNER)
    assert retriever.index_drift(OWNER) == 0
    bundle.dense.remove([metas[3].rid])  # a visible vector missing
    assert retriever.index_drift(OWNER) == 1
    bundle.plain.add([10**9], ["a record the store never had"])  # a stray text
    assert retriever.index_drift(OWNER) == 2
    bundle.ctx_prev[metas[9].rid] = metas[2].rid  # quotes a turn other than the one before it
    assert retriever.index_drift(OWNER) == 3
    bundle.sessions.remove([metas[20].rid])  # a visible turn out of its session
    assert retriever.index_drift(OWNER) == 5  # ... and the time leg holds it
    bundle.times.remove([metas[20].rid])
    assert retriever.index_drift(OWNER) == 4
    bundle.sessions.remove([metas[21].rid])  # in another session than its own
    bundle.sessions.add([metas[21].rid], ["t9/2001-01-01"], ["apples"], ["t9 2001-01-01"])
    assert retriever.index_drift(OWNER) == 5
