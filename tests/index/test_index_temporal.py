"""Tests for the English-only time rules and index.TimeIndex.

The rules: index.asks_when, named_periods, time_expression_score.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from index import TimeIndex, asks_when, named_periods, time_expression_score
from index._temporal import _TIME_EXPRESSIONS
from lethe.locomo import load_locomo


def _ts(y: int, m: int, d: int) -> float:
    return datetime(y, m, d, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    "question",
    [
        "When did Melanie go camping?",
        "How long ago was Caroline's wedding?",
        "What year did John start surfing?",
        "How long has Tim been playing the violin?",
        "In which month did she move?",
        "Since when has he lived there?",
    ],
)
def test_when_questions_are_recognised(question: str) -> None:
    assert asks_when(question)


@pytest.mark.parametrize(
    "question",
    [
        "What did Melanie do when she was camping?",
        "Where did Caroline move from?",
        "Quand est-ce que Mélanie est partie camper ?",  # not English: no rule applies
        "",
    ],
)
def test_other_questions_are_not(question: str) -> None:
    assert not asks_when(question)


@pytest.mark.parametrize(
    "text",
    [
        "I went camping yesterday",
        "we moved last week",
        "I started 3 days ago",
        "a couple of weeks ago we met",
        "see you on Friday",
        "it was in March",
        "back in 2019 I lived in Oslo",
        "since the accident I have not driven",
        "I've been playing for four months",
        "I've been playing for about four months now",
        "Seven years now, and I love it",
        "my car broke down last Fri on my way to work",
        "I met back up with my teammates on the 15th",
        "we went hiking over the weekend",
    ],
)
def test_time_expressions_score_one(text: str) -> None:
    assert time_expression_score(text) == 1.0


@pytest.mark.parametrize(
    "text",
    [
        "I may go",
        "they march on",
        "the cat sleeps on the sofa",
        "",
        "j'y suis allé hier",
        "at last sun came out",
        "for about an hour",
    ],
)
def test_text_without_a_time_expression_scores_zero(text: str) -> None:
    assert time_expression_score(text) == 0.0


def test_a_named_day_with_year() -> None:
    for q in (
        "What did she do on 7 May 2023?",
        "What happened on May 7, 2023?",
        "Plans for the 7th of May, 2023?",
    ):
        (p,) = named_periods(q, range(2022, 2024))
        assert (p.start, p.end, p.granularity) == (_ts(2023, 5, 7), _ts(2023, 5, 8), "day")


def test_a_month_and_a_year() -> None:
    (p,) = named_periods("What did John do in August 2023?", range(0))
    assert (p.start, p.end, p.granularity) == (_ts(2023, 8, 1), _ts(2023, 9, 1), "month")
    (p,) = named_periods("Where was Jolene in 2022?", range(0))
    assert (p.start, p.end, p.granularity) == (_ts(2022, 1, 1), _ts(2023, 1, 1), "year")
    (p,) = named_periods("What did Nate do in December?", range(2022, 2023))
    assert (p.start, p.end) == (_ts(2022, 12, 1), _ts(2023, 1, 1))


def test_a_date_without_a_year_falls_in_every_given_year() -> None:
    found = named_periods("When did Melanie go camping in June?", range(2022, 2024))
    assert [(p.start, p.granularity) for p in found] == [
        (_ts(2022, 6, 1), "month"),
        (_ts(2023, 6, 1), "month"),
    ]
    assert named_periods("When did Melanie go camping in June?", range(0)) == []


def test_no_date_named_gives_nothing() -> None:
    assert named_periods("May I ask what she cooked?", range(2020, 2024)) == []
    assert named_periods("What did she cook?", range(2020, 2024)) == []
    assert named_periods("Qu'a-t-elle fait le 7 mai ?", range(2020, 2024)) == []


def _timeline() -> TimeIndex:
    ix = TimeIndex()
    ix.add(
        [1, 2, 3, 4],
        [_ts(2023, 5, 6), _ts(2023, 5, 7) + 3600, _ts(2023, 5, 8) + 43200, _ts(2023, 6, 20)],
        ["we hiked yesterday", "lunch was good", "the lake", "last week I moved"],
    )
    return ix


def test_window_scores_the_day_and_the_slack_after_it() -> None:
    ix = _timeline()
    hits = ix.window(ix.periods("What did she do on 7 May 2023?"), 10)
    assert [i for i, _ in hits] == [2, 3]
    assert hits[0][1] == 1.0
    assert hits[1][1] == pytest.approx(0.5)


def test_window_limit_never_splits_equal_scores() -> None:
    ix = _timeline()
    year = ix.periods("What did she do in 2023?")  # every turn scores 1
    assert [i for i, _ in ix.window(year, 10)] == [1, 2, 3, 4]
    assert ix.window(year, 3) == []  # not the three earliest of four equals
    day = ix.periods("What did she do on 7 May 2023?")  # 2 scores 1, 3 scores 0.5
    assert [i for i, _ in ix.window(day, 1)] == [2]


def test_window_of_a_question_without_a_date_is_empty_not_a_filter() -> None:
    ix = _timeline()
    assert ix.periods("What did she eat?") == []
    assert ix.window([], 10) == []


def test_prior_only_for_when_questions_and_only_over_candidates() -> None:
    ix = _timeline()
    assert ix.prior("When did she hike?", [1, 2, 3]) == [(1, 1.0)]
    assert ix.prior("When did she hike?", [2, 3]) == []
    assert ix.prior("Where did she hike?", [1, 2, 3, 4]) == []  # not a when-question


def test_removal_and_years() -> None:
    ix = _timeline()
    assert ix.years() == range(2023, 2024)
    assert ix.remove([1, 99]) == 1
    assert ix.prior("When did she hike?", [1, 4]) == [(4, 1.0)]
    assert list(ix.ids()) == [2, 3, 4]
    assert TimeIndex().years() == range(0)


def _any_rule(text: str) -> float:
    """The rules one by one, as ``time_expression_score`` applied them before they were joined.

    They were later joined into one pattern.
    """
    return 1.0 if any(rx.search(text) for rx in _TIME_EXPRESSIONS) else 0.0


def test_the_joined_pattern_scores_every_locomo_turn_as_the_rules_one_by_one(
    locomo_path: Path,
) -> None:
    convs = load_locomo(locomo_path)
    texts = [t for conv in convs for s in conv.sessions.values() for _, _, t in s]
    scores = [time_expression_score(t) for t in texts]
    assert len(texts) > 5000
    assert scores == [_any_rule(t) for t in texts]
    assert 0.05 < sum(scores) / len(scores) < 0.5  # both outcomes are exercised


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "3",
                "a few",
                "days",
                "ago",
                "for",
                "about",
                "now",
                "May",
                "may",
                "Fri",
                "fri",
                "last",
                "the",
                "on",
                "15th",
                "weekend",
                "2019",
                "since",
                "Sunday",
                "\u017fince",  # long s: re.IGNORECASE folds it to "s"
                "TODAY",
                "\u212a",  # Kelvin sign: folds to "k"
                "wee\u212aend",
                "s\u0130nce",  # dotted capital I: matches "i"
                "s\u0131nce",  # dotless i: matches "i"
                "\u0663",  # ARABIC-INDIC DIGIT THREE: a \\d
                "\u0661\u0665th",
                "YESTERDAY",
                "Wednesdays",
                "mon",
                "Mon",
                "autumn",
                "DECADES",
                "x",
            ]
        ),
        max_size=8,
    ).map(" ".join)
)
def test_the_joined_pattern_agrees_with_the_rules_on_any_text(text: str) -> None:
    assert time_expression_score(text) == _any_rule(text)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=40))
def test_the_prefilter_never_skips_a_text_a_rule_matches(text: str) -> None:
    assert time_expression_score(text) == _any_rule(text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "7",
                "42",
                "1999",
                "2024",
                "3rd",
                "15TH",
                "21st",
                "2nd",
                "item",
                "on",
                "the",
                "large",
                "write",
                "x1",
                "19",
                "20",
                "200",
                "2100",
                "th",
                "st",
            ]
        ),
        max_size=10,
    ).map(" ".join)
)
def test_digits_without_a_time_word_score_as_the_rules_say(text: str) -> None:
    """The prefilter passes a digit only for a year or a day number (``_DIGIT_RULES``)."""
    assert time_expression_score(text) == _any_rule(text)


def test_a_long_turn_of_numbers_without_a_time_expression_scores_zero() -> None:
    text = "item 7 costs 42 and " * 800  # 16 KiB, digits, no year, no day number
    assert time_expression_score(text) == 0.0 == _any_rule(text)
    assert time_expression_score(text + " on the 3rd") == 1.0


_steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.lists(st.integers(0, 20), min_size=1, max_size=4, unique=True),
            st.integers(0, 5),  # day; equal days give equal times
        ),
        st.tuples(st.just("remove"), st.lists(st.integers(0, 20), max_size=4), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(steps=_steps)
def test_the_time_arrays_follow_any_adds_and_removals_as_a_fresh_index(
    steps: list[tuple[str, list[int], int]],
) -> None:
    """Times in (time, id) order and in id order stay sorted and agree with a plain dict."""
    ix, model = TimeIndex(), {}
    for op, ids, day in steps:
        if op == "add":
            texts = ["yesterday" if i % 3 == 0 else "the violin" for i in ids]
            ix.add(ids, [_ts(2023, 5, 1 + day)] * len(ids), texts)
            model.update(dict.fromkeys(ids, _ts(2023, 5, 1 + day)))
        else:
            assert ix.remove(ids) == len(set(ids) & model.keys())
            for i in ids:
                model.pop(i, None)
    assert ix.ids().tolist() == sorted(model)
    assert len(ix) == len(model)
    times, order = ix._t.tolist(), list(zip(ix._t.tolist(), ix._i.tolist(), strict=True))
    assert order == sorted((t, i) for i, t in model.items())
    assert dict(zip(ix._by_id.tolist(), ix._t_by_id.tolist(), strict=True)) == model
    fresh = TimeIndex()
    held = sorted(model)
    fresh.add(held, [model[i] for i in held], ["yesterday" if i % 3 == 0 else "x" for i in held])
    periods = named_periods("what happened in May 2023?", ix.years())
    assert ix.window(periods, 50) == fresh.window(periods, 50)
    assert ix.prior("when?", range(21)) == fresh.prior("when?", range(21))
    assert times == sorted(times)
