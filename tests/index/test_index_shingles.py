"""Tests for index.EchoRule, shingles and containment (Broder 1997) over analysed terms."""

import pytest

from index import (
    ECHO_WIDTH,
    EchoRule,
    LexicalIndex,
    analyze,
    containment,
    find_echoes,
    shingles,
)

FACT = "My grandmother's violin was made in Cremona in 1873 and it still has her initials."


def test_shingles_are_contiguous_runs_of_terms() -> None:
    assert shingles(["a1", "b2", "c3", "d4"], 3) == {"a1 b2 c3", "b2 c3 d4"}
    assert shingles(["a1", "b2"], 3) == frozenset()
    with pytest.raises(ValueError, match="width"):
        shingles(["a1"], 0)


def test_containment_is_the_share_of_the_source_found() -> None:
    assert containment({"x", "y"}, {"x", "z"}) == 0.5
    assert containment(set(), {"x"}) == 0.0
    assert containment({"x"}, ["x"]) == 1.0


def test_a_verbatim_quote_inside_a_longer_text_is_an_echo() -> None:
    rule = EchoRule()
    source = rule.shingles(analyze(FACT))
    summary = "Summary of the week: they talked about work. " + FACT + " Then dinner plans."
    assert rule.echoes(source, rule.shingles(analyze(summary)))


def test_pronouns_articles_and_a_framing_clause_change_nothing() -> None:
    rule = EchoRule()
    source = rule.shingles(analyze(FACT))
    edited = (
        "As you told me, your grandmother's violin was made in Cremona in 1873 "
        "and it still has her initials!"
    )
    assert containment(source, rule.shingles(analyze(edited))) == 1.0


def test_an_unrelated_text_is_not_an_echo() -> None:
    rule = EchoRule()
    source = rule.shingles(analyze(FACT))
    other = "I painted a sunrise by the lake with my kids last weekend."
    assert not rule.echoes(source, rule.shingles(analyze(other)))


def test_a_source_without_enough_shingles_is_never_looked_for() -> None:
    rule = EchoRule()
    short = rule.shingles(analyze("Yes, Biscuit!"))
    assert not rule.sweepable(short)
    assert not rule.echoes(short, short)


def test_needed_rounds_up_and_is_at_least_one() -> None:
    assert EchoRule(threshold=0.5).needed(5) == 3
    assert EchoRule(threshold=0.5).needed(4) == 2
    assert EchoRule(threshold=0.1).needed(1) == 1
    with pytest.raises(ValueError, match="threshold"):
        EchoRule(threshold=0.0)
    with pytest.raises(ValueError, match="min_shingles"):
        EchoRule(min_shingles=0)


def test_terms_of_gives_what_add_analysed_in_text_order() -> None:
    ix = LexicalIndex()
    ix.add([1, 2], [FACT, "Melanie: we painted"])
    got = ix.terms_of([1, 3])
    assert got == {1: analyze(FACT)}
    assert ix.terms_of()[2] == ["melani", "paint"]
    ix.remove([1])
    assert ix.terms_of([1]) == {}
    assert ECHO_WIDTH >= 2


def _held(*texts: str) -> LexicalIndex:
    ix = LexicalIndex()
    ix.add(list(range(1, len(texts) + 1)), list(texts))
    return ix


def test_find_echoes_reports_the_texts_that_repeat_a_source() -> None:
    ix = _held(
        f"Ana: {FACT}",
        "Bot: Cremona makes fine violins, I have read.",
        "Bot: Good to know: your grandmother's violin was made in Cremona in 1873 "
        "and it still has her initials.",
        "Bot: Shall we plan the trip?",
    )
    assert find_echoes(ix, [analyze(FACT)], exclude={1}) == {3: [0]}


def test_find_echoes_scans_every_text_past_the_search_bound() -> None:
    ix = _held(f"Ana: {FACT}", "Bot: unrelated chatter about the weather today indeed")
    other = analyze("the weather today indeed was unrelated chatter about nothing")
    found = find_echoes(ix, [analyze(FACT), other], scan_above=1)
    assert found == {1: [0]}
    assert find_echoes(ix, [analyze("Yes!")]) == {}
    assert find_echoes(LexicalIndex(), [analyze(FACT)]) == {}
