"""The session leg of retrieval: BM25 over whole sessions, scores handed to their turns.

A *session* is a group of turns told together (Lethe: the turns of one thread said on
one calendar day). :class:`SessionIndex` keeps one document per session — a header
(its date) plus the terms of every member turn — and ranks sessions with Okapi BM25
(the Lucene variant of :mod:`index._lexical`, Kamphuis et al., ECIR 2020). A search
returns the member turns of the best few sessions, each with its session's score, so
that a turn whose own words miss the question still rises when its conversation is
about it: on LoCoMo (``bench/eval_retrieval.py``) this leg alone adds about +0.02
recall@10 to the three-leg fusion. Session-level retrieval as a first stage follows
LoCoMo's own session-summary recall (Maharana et al., ACL 2024) and the
"session-level" granularity of LongMemEval (Wu et al., ICLR 2025).

The index holds analysed terms (:func:`index.analyze`: the lexical leg's analyzer),
never text. Updates are exact and cheap: a member's term counts are added to or
subtracted from its session's document, so removing a turn re-indexes its session at
once, with no rebuild and nothing of the removed turn left behind. Collection
statistics (number of sessions, document frequencies, mean length) are always
current.

Parameters: ``k1 = 1.2`` and ``b = 0.75`` (Lucene's defaults): session documents are
long (hundreds of terms) and vary in length, unlike single turns.

Threads: any thread may call any method; one mutex guards the index (a search costs
microseconds per session holding a query term). Refuses pickling and writes no file;
:meth:`SessionIndex.to_state` hands its whole state to a caller that seals it
(Lethe's encrypted index snapshots) and :meth:`SessionIndex.from_state` makes it again.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from index._lexical import analyze
from index._state import State, strings_from_arrays, strings_to_arrays

__all__ = ["SessionIndex"]

_INT64 = np.iinfo(np.int64)

K1 = 1.2
"""BM25 term-frequency saturation of session documents (Lucene's default)."""
B = 0.75
"""BM25 length normalisation of session documents (Lucene's default)."""

_MEMBER_TERM_BYTES = 46
"""Estimated bytes per distinct term of a member (see :meth:`SessionIndex.nbytes`)."""
_VOCAB_BYTES = 160
"""Estimated bytes per vocabulary term (its postings dict)."""


def _as_id_list(ids: npt.ArrayLike) -> list[int]:
    """Validate ids as 1-D int64 values.

    Raises:
        ValueError: ``ids`` is not 1-D, holds a non-integer (``bool`` included), or
            holds a value outside int64.
    """
    raw = np.asarray(ids)
    if raw.ndim != 1:
        raise ValueError(f"ids must be 1-D, got ndim {raw.ndim}")
    if raw.size == 0:
        return []
    if raw.dtype == np.bool_ or not np.issubdtype(raw.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {raw.dtype}")
    out = [int(i) for i in raw.tolist()]
    if min(out) < int(_INT64.min) or max(out) > int(_INT64.max):
        raise ValueError("ids must fit in int64")
    return out


class _Numbering:
    """Term ids for a state: an index's own (``tid``), new ones appended to ``words``."""

    def __init__(self, tid: dict[str, int], words: list[str]) -> None:
        self._tid = tid
        self._extra: dict[str, int] = {}
        self.words = words

    def number(self, term: str) -> int:
        """The id of ``term``; a term without one gets the next id (appended to ``words``)."""
        found = self._tid.get(term)
        if found is None:
            found = self._extra.get(term)
            if found is None:
                found = self._extra[term] = len(self.words)
                self.words.append(term)
        return found


def _counts_to_arrays(
    counts: Sequence[dict[str, int]], vocab: _Numbering
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Term counts as CSR arrays ``(ptr (n + 1,), term ids, counts)``, all int64.

    Terms are numbered by ``vocab``, which grows as new terms are met.
    """
    ptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, counts), np.int64, count=len(counts)), out=ptr[1:])
    total = int(ptr[-1])
    terms = np.fromiter((vocab.number(t) for c in counts for t in c), np.int64, count=total)
    tfs = np.fromiter((tf for c in counts for tf in c.values()), np.int64, count=total)
    return ptr, terms, tfs


def _counts_from_arrays(
    ptr: npt.NDArray[Any], terms: npt.NDArray[Any], tfs: npt.NDArray[Any], vocab: Sequence[str]
) -> list[dict[str, int]]:
    """The term counts :func:`_counts_to_arrays` made.

    Raises:
        ValueError: The arrays disagree or name an unknown term or a count below 1.
    """
    bounds = ptr.tolist()
    if not bounds or bounds[0] != 0 or bounds[-1] != len(terms) or len(tfs) != len(terms):
        raise ValueError("malformed SessionIndex term counts")
    if len(terms) and (int(terms.min()) < 0 or int(terms.max()) >= len(vocab)):
        raise ValueError("SessionIndex term counts name unknown terms")
    if len(tfs) and int(tfs.min()) < 1:
        raise ValueError("SessionIndex term counts below 1")
    words = np.asarray(vocab, dtype=object)[terms].tolist() if len(terms) else []
    counts = tfs.tolist()
    return [dict(zip(words[a:b], counts[a:b], strict=True)) for a, b in itertools.pairwise(bounds)]


def _packed_from_arrays(
    ptr: npt.NDArray[Any], terms: npt.NDArray[Any], tfs: npt.NDArray[Any], vocab_size: int
) -> list[bytes]:
    """Members' term counts from CSR arrays, packed as :meth:`SessionIndex._pack` packs them.

    Raises:
        ValueError: The arrays disagree or name an unknown term or a count below 1.
    """
    bounds = ptr.tolist()
    if not bounds or bounds[0] != 0 or bounds[-1] != len(terms) or len(tfs) != len(terms):
        raise ValueError("malformed SessionIndex term counts")
    if len(terms) and (int(terms.min()) < 0 or int(terms.max()) >= vocab_size):
        raise ValueError("SessionIndex term counts name unknown terms")
    if len(tfs) and (int(tfs.min()) < 1 or int(tfs.max()) > np.iinfo(np.int32).max):
        raise ValueError("SessionIndex term counts outside 1..2**31-1")
    pairs = np.empty((len(terms), 2), np.int32)
    pairs[:, 0], pairs[:, 1] = terms, tfs
    return [pairs[a:b].tobytes() for a, b in itertools.pairwise(bounds)]


def _postings(
    arrays: dict[str, npt.NDArray[Any]], keys: Sequence[str], vocab: Sequence[str]
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The postings (term -> {session: tf}) and the lengths (session -> terms) of a state.

    Raises:
        ValueError: They disagree with the sessions and the vocabulary.
    """
    try:
        terms, bounds = arrays["post_terms"].tolist(), arrays["post_ptr"].tolist()
        at, tfs = arrays["post_sessions"], arrays["post_tfs"].tolist()
        lengths = arrays["lengths"].tolist()
    except KeyError as exc:
        raise ValueError(f"malformed SessionIndex state: {exc!r}") from None
    if len(bounds) != len(terms) + 1 or bounds[0] != 0 or bounds[-1] != len(at) != len(tfs):
        raise ValueError("malformed SessionIndex postings")
    if len(lengths) != len(keys) or (terms and (min(terms) < 0 or max(terms) >= len(vocab))):
        raise ValueError("malformed SessionIndex postings")
    if len(at) and (int(at.min()) < 0 or int(at.max()) >= len(keys)):
        raise ValueError("SessionIndex postings name unknown sessions")
    named = np.asarray(keys, dtype=object)[at].tolist() if len(at) else []
    post = {
        vocab[t]: dict(zip(named[a:b], tfs[a:b], strict=True))
        for t, (a, b) in zip(terms, itertools.pairwise(bounds), strict=True)
    }
    return post, dict(zip(keys, lengths, strict=True))


class SessionIndex:
    """BM25 over sessions of turns keyed by int64 ids, held only in memory.

    Args:
        k1: BM25 term-frequency saturation, ``> 0``; default :data:`K1`.
        b: BM25 length normalisation in ``[0, 1]``; default :data:`B`.

    Raises:
        ValueError: ``k1 <= 0`` or ``b`` outside ``[0, 1]``.
    """

    def __init__(self, k1: float = K1, b: float = B) -> None:
        if not k1 > 0.0:
            raise ValueError(f"k1 must be > 0, got {k1}")
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"b must be in [0, 1], got {b}")
        self._k1 = k1
        self._b = b
        self._lock = threading.Lock()
        self._of: dict[int, str] = {}  # member id -> session key
        # member id -> its term counts, packed: int32 pairs (term id, count) as bytes
        # (a dict of strings per member held ~5x the memory at 100k members)
        self._terms: dict[int, bytes] = {}
        self._tid: dict[str, int] = {}  # posted term -> term id
        self._word: list[str] = []  # term id -> term ("" once free)
        self._free: list[int] = []  # term ids free for reuse
        self._members: dict[str, set[int]] = {}  # session key -> member ids
        self._header: dict[str, dict[str, int]] = {}  # session key -> header term counts
        self._post: dict[str, dict[str, int]] = {}  # term -> {session key: tf}
        self._length: dict[str, int] = {}  # session key -> document length (terms)
        self._total = 0  # sum of document lengths
        self._distinct = 0  # sum over members of their distinct terms (for nbytes)
        self._sorted: dict[str, tuple[int, ...]] = {}  # session key -> members ascending
        # Scoring cache, dropped by any change: the session keys in order (a row
        # each) and, per query term met since, its BM25 contribution to every row.
        self._keys: list[str] | None = None
        self._row_of: dict[str, int] = {}
        self._contrib: dict[str, npt.NDArray[np.float64]] = {}

    # ------------------------------------------------------------------ updates

    def add(
        self,
        ids: npt.ArrayLike,
        sessions: Sequence[str],
        texts: Sequence[str],
        headers: Sequence[str],
    ) -> None:
        """Index turns as members of their sessions, replacing any held under the same ids.

        A session's document is its header plus its members' terms; the header is set
        by the first member added to a session (later ones must give the same header
        for the same session, as the server does: the session's date).

        Args:
            ids: ``(n,)`` integers within int64, distinct.
            sessions: ``n`` session keys (any strings; equal keys = one session).
            texts: ``n`` member texts.
            headers: ``n`` header texts, one per member (its session's header).

        Raises:
            ValueError: ``ids`` is invalid, has duplicates, or the four lengths differ.
            TypeError: an element of ``sessions``, ``texts`` or ``headers`` is not a
                ``str``.
        """
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("sessions, texts and headers must be strings")
        self.add_terms(ids, sessions, [analyze(t) for t in texts], headers)

    def add_terms(
        self,
        ids: npt.ArrayLike,
        sessions: Sequence[str],
        terms: Sequence[Sequence[str]],
        headers: Sequence[str],
    ) -> None:
        """Add member texts already analysed, as :meth:`add` adds texts.

        ``terms[i]`` is ``analyze(text)`` of the i-th member, so a text indexed in
        several legs is analysed once. A header is analysed only when its session is new.

        Raises:
            ValueError, TypeError: as :meth:`add`.
        """
        id_list = _as_id_list(ids)
        n = len(id_list)
        if not len(sessions) == len(terms) == len(headers) == n:
            raise ValueError(
                f"got {n} ids, {len(sessions)} sessions, {len(terms)} texts, {len(headers)} headers"
            )
        if len(set(id_list)) != n:
            raise ValueError("ids must be distinct within one add")
        for seq in (sessions, headers):
            if not all(isinstance(s, str) for s in seq):
                raise TypeError("sessions, texts and headers must be strings")
        analysed = [Counter(t) for t in terms]
        with self._lock:
            for id_, session, counts, header in zip(
                id_list, sessions, analysed, headers, strict=True
            ):
                self._drop(id_)
                if session not in self._members:
                    head = Counter(analyze(header))
                    self._members[session] = set()
                    self._header[session] = head
                    self._length[session] = 0
                    self._count(session, head, +1)
                self._members[session].add(id_)
                self._sorted.pop(session, None)
                self._of[id_] = session
                self._count(session, counts, +1)
                self._terms[id_] = self._pack(counts)
                self._distinct += len(counts)

    def remove(self, ids: npt.ArrayLike) -> int:
        """Remove member turns; their sessions' documents lose their terms at once.

        A session left without members is dropped with its header.

        Args:
            ids: ``(n,)`` integers within int64; absent ids are ignored.

        Returns:
            The number of members removed.

        Raises:
            ValueError: ``ids`` is not 1-D integers within int64.
        """
        id_list = _as_id_list(ids)
        with self._lock:
            return sum(self._drop(i) for i in set(id_list))

    def _count(self, session: str, terms: dict[str, int], sign: int) -> None:
        """Add (``sign=+1``) or subtract (``-1``) term counts to a session; holds the lock."""
        for term, tf in terms.items():
            post = self._post.setdefault(term, {})
            new = post.get(session, 0) + sign * tf
            if new > 0:
                post[session] = new
            else:
                post.pop(session, None)
                if not post:
                    del self._post[term]
                    tid = self._tid.pop(term, None)
                    if tid is not None:  # nothing holds the term: its id and word go
                        self._word[tid] = ""
                        self._free.append(tid)
        size = sign * sum(terms.values())
        self._length[session] += size
        self._total += size
        self._sorted.pop(session, None)
        self._keys = None

    def _pack(self, counts: dict[str, int]) -> bytes:
        """A member's term counts as int32 pairs ``(term id, count)``; holds the lock.

        Every term of ``counts`` is posted (the caller counted it first), so its
        id stays taken while the member holds it.
        """
        tid_of = self._tid
        for term in [t for t in counts if t not in tid_of]:  # new terms: free ids first
            if self._free:
                tid = self._free.pop()
                self._word[tid] = term
            else:
                tid = len(self._word)
                self._word.append(term)
            tid_of[term] = tid
        pairs = np.empty((len(counts), 2), np.int32)
        pairs[:, 0] = [tid_of[term] for term in counts]
        pairs[:, 1] = list(counts.values())
        return pairs.tobytes()

    def _unpack(self, packed: bytes) -> dict[str, int]:
        """The term counts :meth:`_pack` packed; holds the lock."""
        pairs = np.frombuffer(packed, np.int32).reshape(-1, 2).tolist()
        word = self._word
        return {word[tid]: tf for tid, tf in pairs}

    def _drop(self, id_: int) -> int:
        """Remove one member; holds the lock. Returns 1 if it was held, else 0."""
        session = self._of.pop(id_, None)
        if session is None:
            return 0
        terms = self._unpack(self._terms.pop(id_))
        self._distinct -= len(terms)
        self._count(session, terms, -1)
        members = self._members[session]
        members.discard(id_)
        self._sorted.pop(session, None)
        if not members:
            self._count(session, self._header.pop(session), -1)
            del self._members[session]
            del self._length[session]
        return 1

    # ------------------------------------------------------------------ search

    def search_sessions(self, query: str, sessions: int) -> list[tuple[str, float]]:
        """Rank sessions by BM25 against ``query``.

        Args:
            query: Free text, analysed like the indexed texts.
            sessions: Maximum number of sessions, ``>= 1``.

        Returns:
            Up to ``sessions`` pairs ``(session key, score > 0)``, best first, ties by
            key; empty when no query term is held.

        Raises:
            ValueError: ``sessions < 1``.
            TypeError: ``query`` is not a ``str``.
        """
        if sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {sessions}")
        if not isinstance(query, str):
            raise TypeError("query must be a string")
        terms = analyze(query)
        with self._lock:
            return self._rank(terms, sessions)

    def _rank(self, terms: Sequence[str], sessions: int) -> list[tuple[str, float]]:
        """BM25 of every session, best ``sessions`` first; the caller holds the lock.

        Each term's contribution to every session (``idf * tf / (tf + k1 (1 - b + b
        |d| / avgdl))``, Lucene's variant) is computed once per change of the index
        and summed as numpy rows.
        """
        if not self._members or not terms:
            return []
        keys = self._keys
        if keys is None:
            keys = self._keys = sorted(self._members)
            self._row_of = {key: i for i, key in enumerate(keys)}
            self._contrib = {}
        rows = []
        for term in terms:
            row = self._contrib.get(term)
            if row is None:
                post = self._post.get(term)
                if not post:
                    continue
                row = self._contrib[term] = self._row(keys, post)
            rows.append(row)
        if not rows:
            return []
        total = rows[0] if len(rows) == 1 else np.sum(rows, axis=0)
        best = np.argsort(-total, kind="stable")[:sessions]  # ties: keys in order
        return [(keys[i], float(total[i])) for i in best.tolist() if total[i] > 0.0]

    def _row(self, keys: list[str], post: dict[str, int]) -> npt.NDArray[np.float64]:
        n = len(keys)
        avgdl = self._total / n if self._total else 1.0
        df = len(post)
        idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        row = np.zeros(n, dtype=np.float64)
        k1, b, length, row_of = self._k1, self._b, self._length, self._row_of
        for key, tf in post.items():
            row[row_of[key]] = idf * tf / (tf + k1 * (1.0 - b + b * length[key] / avgdl))
        return row

    def search(self, query: str, sessions: int) -> list[tuple[int, float]]:
        """The member turns of the best ``sessions`` sessions, each with its session's score.

        Args:
            query: Free text, analysed like the indexed texts.
            sessions: How many of the best sessions contribute their members, ``>= 1``.

        Returns:
            ``(id, score)`` pairs, best first (a session's members share its BM25
            score), ties by ascending id; empty when no query term is held.

        Raises:
            ValueError: ``sessions < 1``.
            TypeError: ``query`` is not a ``str``.
        """
        if not isinstance(query, str):
            raise TypeError("query must be a string")
        return self.search_terms(analyze(query), sessions)

    def search_terms(self, terms: Sequence[str], sessions: int) -> list[tuple[int, float]]:
        """Search with a query already analysed, as :meth:`search`.

        The query's terms are ``index.analyze(query)``, the analyzer of the lexical
        legs, so that the legs analyse one query once.

        Args:
            terms: The query's terms, as :func:`index.analyze` gives them.
            sessions: How many of the best sessions contribute their members, ``>= 1``.

        Returns:
            As :meth:`search`.

        Raises:
            ValueError: ``sessions < 1``.
        """
        if sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {sessions}")
        out: list[tuple[int, float]] = []
        with self._lock:
            ranked = self._rank(terms, sessions)
            for session, score in ranked:
                members = self._sorted.get(session)
                if members is None:
                    members = self._sorted[session] = tuple(sorted(self._members[session]))
                out.extend([(id_, score) for id_ in members])
        if any(a[1] == b[1] for a, b in itertools.pairwise(ranked)):
            out.sort(key=lambda hit: (-hit[1], hit[0]))  # equal sessions: ids in order
        return out

    # ------------------------------------------------------------------ inspection

    @property
    def parameters(self) -> tuple[float, float]:
        """``(k1, b)``, the BM25 parameters this index ranks sessions with."""
        return self._k1, self._b

    def session_of(self, id_: int) -> str | None:
        """The session key a member is held under, or None when it is not held."""
        with self._lock:
            return self._of.get(int(id_))

    def sessions(self) -> dict[str, frozenset[int]]:
        """Every session and its member ids, for audits of drift against the store."""
        with self._lock:
            return {s: frozenset(m) for s, m in self._members.items()}

    def ids(self) -> npt.NDArray[np.int64]:
        """All member ids held, ``(len(self),) int64`` ascending."""
        with self._lock:
            held = np.fromiter(self._of.keys(), dtype=np.int64, count=len(self._of))
        return np.sort(held)

    def nbytes(self) -> int:
        """An estimate of the bytes this index holds (for the index cache's bound).

        :data:`_MEMBER_TERM_BYTES` per distinct term of each member (its term
        counts, its share of the postings and of the member maps) and
        :data:`_VOCAB_BYTES` per vocabulary term, fitted to what ``tracemalloc``
        sees on the test's texts at 1,000 to 20,000 members (within 14 %;
        ``tests/index/test_index_sessions.py`` checks it within 30 %); plus the
        scoring cache exactly (8 bytes per session per cached term, and
        :data:`_VOCAB_BYTES` for its entry) and 8 bytes per sorted member. O(1)
        plus the number of cached terms.
        """
        with self._lock:
            held = self._distinct * _MEMBER_TERM_BYTES + len(self._post) * _VOCAB_BYTES
            held += sum(row.nbytes + _VOCAB_BYTES for row in self._contrib.values())
            held += 8 * sum(len(m) for m in self._sorted.values())
            return held

    def __len__(self) -> int:
        """Number of member turns held."""
        with self._lock:
            return len(self._of)

    def __contains__(self, id_: object) -> bool:
        """Whether a member is held under ``id_`` (an ``int``; anything else is absent)."""
        if not isinstance(id_, (int, np.integer)) or isinstance(id_, bool):
            return False
        with self._lock:
            return int(id_) in self._of

    def to_state(self) -> State:
        """The whole index as a :data:`index.State` (see :mod:`index._state`).

        Each member's term counts and session, each session's key, header
        counts and length, and the postings, under the mutex. Updates are
        exact, so nothing of a removed member is held to begin with.

        Returns:
            ``(meta, arrays)``; see the source for the array names.
        """
        with self._lock:
            keys = list(self._members)
            key_at = {key: i for i, key in enumerate(keys)}
            ids = np.fromiter(self._of.keys(), np.int64, count=len(self._of))
            member_session = np.fromiter(
                (key_at[k] for k in self._of.values()), np.int64, count=len(self._of)
            )
            # Members' term ids are this index's own (free ids are written empty);
            # terms only headers hold are numbered after them.
            words = list(self._word)
            vocab = _Numbering(self._tid, words)
            packed = [self._terms[i] for i in self._of]
            m_ptr = np.zeros(len(packed) + 1, np.int64)
            np.cumsum(
                np.fromiter(map(len, packed), np.int64, count=len(packed)) // 8, out=m_ptr[1:]
            )
            pairs = np.frombuffer(b"".join(packed), np.int32).reshape(-1, 2)
            m_terms, m_counts = pairs[:, 0].copy(), pairs[:, 1].copy()
            del packed, pairs
            h_ptr, h_terms, h_counts = _counts_to_arrays([self._header[k] for k in keys], vocab)
            posted = list(self._post.items())
            p_ptr = np.zeros(len(posted) + 1, np.int64)
            np.cumsum(
                np.fromiter((len(p) for _, p in posted), np.int64, count=len(posted)),
                out=p_ptr[1:],
            )
            count = int(p_ptr[-1])
            p_sessions = np.fromiter(
                (key_at[k] for _, p in posted for k in p), np.int64, count=count
            )
            p_tfs = np.fromiter((tf for _, p in posted for tf in p.values()), np.int64, count=count)
            p_terms = np.fromiter((vocab.number(t) for t, _ in posted), np.int64, count=len(posted))
            lengths = np.fromiter((self._length[k] for k in keys), np.int64, count=len(keys))
            meta: dict[str, Any] = {"kind": "SessionIndex", "k1": self._k1, "b": self._b}
        key_blob, key_ptr = strings_to_arrays(keys)
        term_blob, term_ptr = strings_to_arrays(words)
        return meta, {
            "term_blob": term_blob,
            "term_ptr": term_ptr,
            "key_blob": key_blob,
            "key_ptr": key_ptr,
            "member_ids": ids,
            "member_session": member_session,
            "member_ptr": m_ptr,
            "member_terms": m_terms,
            "member_counts": m_counts,
            "header_ptr": h_ptr,
            "header_terms": h_terms,
            "header_counts": h_counts,
            "lengths": lengths,
            "post_terms": p_terms,
            "post_ptr": p_ptr,
            "post_sessions": p_sessions,
            "post_tfs": p_tfs,
        }

    @classmethod
    def from_state(cls, state: State) -> SessionIndex:
        """The index :meth:`to_state` described, ranking as it did.

        Args:
            state: ``(meta, arrays)`` from :meth:`to_state`.

        Returns:
            A new index with the same members, sessions, headers and statistics.

        Raises:
            ValueError: The state is not a :meth:`to_state` of this version, or
                its parts disagree.
        """
        meta, arrays = state
        try:
            if meta["kind"] != "SessionIndex":
                raise ValueError(f"not a SessionIndex state: {meta['kind']!r}")
            out = cls(float(meta["k1"]), float(meta["b"]))
            vocab = strings_from_arrays(arrays["term_blob"], arrays["term_ptr"])
            keys = strings_from_arrays(arrays["key_blob"], arrays["key_ptr"])
            ids = arrays["member_ids"].tolist()
            sessions = arrays["member_session"].tolist()
            members = _packed_from_arrays(
                arrays["member_ptr"], arrays["member_terms"], arrays["member_counts"], len(vocab)
            )
            headers = _counts_from_arrays(
                arrays["header_ptr"], arrays["header_terms"], arrays["header_counts"], vocab
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed SessionIndex state: {exc!r}") from None
        if not len(ids) == len(sessions) == len(members) or len(headers) != len(keys):
            raise ValueError("the SessionIndex state's parts disagree")
        if sessions and (min(sessions) < 0 or max(sessions) >= len(keys)):
            raise ValueError("the SessionIndex state's members name unknown sessions")
        if len(set(ids)) != len(ids) or len(set(keys)) != len(keys):
            raise ValueError("the SessionIndex state holds a member or a session twice")
        out._of = {id_: keys[at] for id_, at in zip(ids, sessions, strict=True)}
        out._terms = dict(zip(ids, members, strict=True))
        out._header = dict(zip(keys, headers, strict=True))
        out._members = {key: set() for key in keys}
        for id_, key in out._of.items():
            out._members[key].add(id_)
        if any(not m for m in out._members.values()):
            raise ValueError("the SessionIndex state holds a session without members")
        out._distinct = len(arrays["member_terms"])
        out._post, out._length = _postings(arrays, keys, vocab)
        out._total = sum(out._length.values())
        posted = np.fromiter((w in out._post for w in vocab), np.bool_, count=len(vocab))
        if len(arrays["member_terms"]) and not posted[arrays["member_terms"]].all():
            raise ValueError("the SessionIndex state's members hold terms without postings")
        out._word = [w if held else "" for w, held in zip(vocab, posted.tolist(), strict=True)]
        out._tid = {w: i for i, w in enumerate(out._word) if w}
        out._free = [i for i, w in enumerate(out._word) if not w]
        return out

    def __repr__(self) -> str:
        with self._lock:
            return f"SessionIndex(k1={self._k1}, b={self._b}, sessions={len(self._members)})"

    def __reduce__(self) -> NoReturn:
        raise TypeError("SessionIndex holds plaintext terms and cannot be pickled")
