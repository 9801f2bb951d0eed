"""Word shingles and containment: whether one text repeats another, verbatim or nearly.

The echo sweep and the echo guard of a forget (``server.lifecycle``) ask one question
of two texts: does ``candidate`` contain ``source``'s distinctive content? This module
answers it with *w-shingling* and *containment* (Broder, "On the resemblance and
containment of documents", Compression and Complexity of Sequences 1997): a text's
shingles are its contiguous runs of ``w`` tokens, and the containment of ``A`` in
``B`` is ``|S(A) ∩ S(B)| / |S(A)|`` — the share of ``A``'s shingles found in ``B``,
whatever else ``B`` says. A summary that quotes a turn among ten others contains it
fully; a reply that says it again with a framing clause and one word changed contains
most of it.

Tokens are the lexical index's terms (:func:`index.analyze`: lower-cased word tokens,
English stopwords out, Snowball stems), so shingles run over content words only:
"I adopted a puppy" and "you adopted the puppies" give the same shingles, and a
change of pronoun, tense, article or punctuation changes none. Dropping stopwords
before shingling is how the near-duplicate detectors of the web prune shingles
that carry no content (Theobald, Siddharth and Paepcke, "SpotSigs: robust and
efficient near duplicate detection in large web collections", SIGIR 2008, anchor
theirs on stopwords for the same reason).

The rule (:class:`EchoRule`): ``candidate`` echoes ``source`` when ``source`` has at
least ``min_shingles`` distinct shingles and at least ``threshold`` of them are in
``candidate``. The defaults (:data:`ECHO_WIDTH`, :data:`ECHO_THRESHOLD`,
:data:`ECHO_MIN_SHINGLES`) were chosen on LoCoMo conversations 1-5 and are reported
on conversations 6-10 by ``bench/eval_echoes.py`` (docs/benchmarks.md, "Echoes").

Limits, by construction: a paraphrase (other words for the same fact) shares no
shingles and is never an echo; a text with fewer than ``min_shingles`` distinct
shingles (a few content words: "Yes, Biscuit!") has no distinctive content to look
for; a candidate that repeats only part of a long source is an echo only if that part
is ``threshold`` of the source's shingles.

Candidates (:func:`find_echoes`): a text that contains most of a source's shingles
contains most of its terms, so the best BM25 matches of the source's terms in a
:class:`~index.LexicalIndex` (:data:`ECHO_DEPTH` of them) are the texts worth
checking; each is then checked by containment over the terms the index holds for it,
without reading the text again. Past :data:`ECHO_SCAN_ABOVE` sources (a thread
forgotten whole) one pass over every held text costs less than a search per source.
A candidate the search ranks below the depth is missed (``bench/eval_echoes.py``
measures how often).

Pure: no I/O, no state but the index it is given; any thread.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from index._lexical import LexicalIndex

__all__ = [
    "ECHO_DEPTH",
    "ECHO_MIN_SHINGLES",
    "ECHO_SCAN_ABOVE",
    "ECHO_THRESHOLD",
    "ECHO_WIDTH",
    "EchoRule",
    "containment",
    "find_echoes",
    "shingles",
]

ECHO_WIDTH = 2
"""Tokens per shingle (content words; see the module docstring)."""
ECHO_THRESHOLD = 0.7
"""Share of a source's shingles a candidate must contain to echo it, in ``(0, 1]``."""
ECHO_MIN_SHINGLES = 5
"""Fewest distinct shingles a source needs to be looked for at all."""
ECHO_DEPTH = 32
"""Candidates per source: the best BM25 matches of its terms (:func:`find_echoes`)."""
ECHO_SCAN_ABOVE = 64
"""Sources from which :func:`find_echoes` reads every held text instead of searching."""


def shingles(terms: Sequence[str], width: int = ECHO_WIDTH) -> frozenset[str]:
    """The distinct ``width``-shingles of a token sequence, each its tokens joined by a space.

    Tokens are :func:`index.analyze` terms (runs of word characters), so the space
    never occurs inside one and the joined form is unambiguous.

    Args:
        terms: tokens in text order.
        width: tokens per shingle, ``>= 1``.

    Returns:
        The set of shingles; empty when ``terms`` has fewer than ``width`` tokens.

    Raises:
        ValueError: ``width < 1``.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    return frozenset(" ".join(terms[i : i + width]) for i in range(len(terms) - width + 1))


def containment(source: Collection[str], candidate: Collection[str]) -> float:
    """Broder's containment of ``source`` in ``candidate``: ``|S ∩ C| / |S|`` (0 for an empty S)."""
    if not source:
        return 0.0
    inside = candidate if isinstance(candidate, (set, frozenset)) else set(candidate)
    return sum(1 for s in source if s in inside) / len(source)


@dataclass(frozen=True, slots=True)
class EchoRule:
    """When a candidate text echoes a source text (see the module docstring).

    Attributes:
        width: tokens per shingle, ``>= 1``.
        threshold: least containment of the source in the candidate, in ``(0, 1]``.
        min_shingles: fewest distinct shingles a source needs, ``>= 1``.

    Raises:
        ValueError: a parameter is out of range.
    """

    width: int = ECHO_WIDTH
    threshold: float = ECHO_THRESHOLD
    min_shingles: int = ECHO_MIN_SHINGLES

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ValueError(f"width must be >= 1, got {self.width}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.min_shingles < 1:
            raise ValueError(f"min_shingles must be >= 1, got {self.min_shingles}")

    def shingles(self, terms: Sequence[str]) -> frozenset[str]:
        """:func:`shingles` at this rule's width."""
        return shingles(terms, self.width)

    def sweepable(self, source: Collection[str]) -> bool:
        """Whether a source's shingle set has enough distinctive content to be looked for."""
        return len(source) >= self.min_shingles

    def needed(self, source_size: int) -> int:
        """How many of a source's ``source_size`` shingles a candidate must contain (``>= 1``)."""
        return max(1, math.ceil(self.threshold * source_size - 1e-9))

    def echoes(self, source: Collection[str], candidate: Iterable[str]) -> bool:
        """Whether ``candidate`` (its shingles) echoes ``source`` (its shingles)."""
        if not self.sweepable(source):
            return False
        inside = source if isinstance(source, (set, frozenset)) else set(source)
        need = self.needed(len(inside))
        found = 0
        for shingle in set(candidate):
            if shingle in inside:
                found += 1
                if found >= need:
                    return True
        return False


def find_echoes(
    index: LexicalIndex,
    sources: Sequence[Sequence[str]],
    rule: EchoRule | None = None,
    *,
    exclude: Collection[int] = frozenset(),
    depth: int = ECHO_DEPTH,
    scan_above: int = ECHO_SCAN_ABOVE,
) -> dict[int, list[int]]:
    """The texts held in ``index`` that echo one of ``sources`` (see the module docstring).

    Args:
        index: the texts to look in (their terms as :func:`index.analyze` made them).
        sources: each source's terms, in text order.
        rule: the echo rule; default :class:`EchoRule` ``()``.
        exclude: ids never reported (the sources themselves, say).
        depth: BM25 candidates per source, ``>= 1``.
        scan_above: sweepable sources from which every held text is read instead.

    Returns:
        ``{id: indexes into sources of the sources it echoes}``, ids ascending.
    """
    rule = rule or EchoRule()
    # Shingles as tuples of terms here (``zip`` builds them in C, no string is
    # joined); the same sets as :func:`shingles`, in another spelling.
    sets = [_grams(terms, rule.width) for terms in sources]
    live = [i for i, s in enumerate(sets) if len(s) >= rule.min_shingles]
    if not live or not len(index):
        return {}
    if len(live) > scan_above:
        held = index.terms_of()
        wanted: dict[int, list[int]] = {rid: live for rid in held}
    else:
        wanted = {}
        for i in live:
            for rid, _ in index.search_terms(list(sources[i]), depth + len(exclude)):
                wanted.setdefault(rid, []).append(i)
        held = index.terms_of(wanted)
    need = {i: rule.needed(len(sets[i])) for i in live}
    out: dict[int, list[int]] = {}
    for rid in sorted(held):
        if rid in exclude:
            continue
        mine = _grams(held[rid], rule.width)
        hits = [i for i in wanted[rid] if len(sets[i] & mine) >= need[i]]
        if hits:
            out[rid] = hits
    return out


def _grams(terms: Sequence[str], width: int) -> frozenset[tuple[str, ...]]:
    """The distinct ``width``-shingles of ``terms`` as tuples (:func:`shingles`, unjoined)."""
    return frozenset(zip(*(terms[i:] for i in range(width)), strict=False))
