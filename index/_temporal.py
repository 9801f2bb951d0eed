"""Time signals for retrieval: when-questions, time expressions, and named dates.

Two legs of :mod:`index` use them, both English-only heuristics written for this
project from the question and turn phrasings of LoCoMo (Maharana et al., ACL 2024),
conversations 1-5 only (the tuning split of ``bench/eval_retrieval.py``); they were
never fitted to conversations 6-10, on which their effect is reported:

- the *time-expression prior*: a question that asks when or how long
  (:func:`asks_when`: "When did…", "How long ago…", "What year…", "Since when…")
  gives a score to the candidate turns whose text carries a time expression
  (:func:`time_expression_score`: yesterday, last week, N days ago, a weekday, a
  month, a year, "since …"). In a conversation the answer to "when" is usually a
  turn that anchors an event to the time it was said ("I went camping last
  weekend").
- the *session-date window*: a question that names a date, a month or a year
  (:func:`named_periods`: "on 7 May 2023", "in June", "in 2022") selects the turns
  said on or just after it — an event of a given day is told in the first
  conversation after it.

A heuristic that matches nothing yields nothing (``False``, ``0.0``, ``[]``): the
callers then add no leg, never a filter. Any language but English matches nothing.

Dates are calendar dates in UTC, as Lethe stores turn times (seconds since the Unix
epoch). Everything here is pure and thread-safe.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = [
    "NamedPeriod",
    "asks_when",
    "named_periods",
    "time_expression_score",
]

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_MONTH_RE = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)"
)
_NUMBER_WORDS = (
    r"(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
    r"a\s+few|a\s+couple\s+of|a\s+couple|couple\s+of|few|several)"
)
_UNIT = r"(?:days?|weeks?|weekends?|months?|years?|decades?)"
_ABOUT = r"(?:about|around|over|almost|nearly|roughly|close\s+to|more\s+than)"
_WEEKDAY = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)s?"

# Questions that ask for a time or a duration. Anchored at the start (after an
# optional "and"/"so"/"but"/"in"/"on"/"at"/"by"), so that a "when" in the middle
# ("what did she do when ...") is a conjunction, not a question word.
_ASKS_WHEN = re.compile(
    r"^\s*(?:(?:and|so|but|in|on|at|by|from|until|till)\s+)?"
    r"(?:when\b|since\s+when\b|how\s+long\b|after\s+how\s+long\b|how\s+soon\b|"
    r"(?:what|which)\s+(?:year|month|day|date|week|weekend|season|time|age)s?\b|"
    r"how\s+many\s+(?:days|weeks|months|years)\b|"
    r"how\s+old\b|at\s+what\s+age\b)",
    re.IGNORECASE,
)
_HOW_LONG_AGO = re.compile(r"\bhow\s+long\s+ago\b|\bwhat\s+date\b", re.IGNORECASE)

_N_UNITS_AGO = re.compile(rf"\b{_NUMBER_WORDS}\s+{_UNIT}\s+ago\b", re.IGNORECASE)

# Time expressions in a turn. Case-insensitive except month and weekday names,
# which must be capitalised ("May" the month, not the verb; "march" the verb).
_TIME_EXPRESSIONS = [
    re.compile(
        r"\b(?:yesterday|today|tonight|tomorrow|recently|lately|earlier\s+today|"
        r"the\s+other\s+day|the\s+day\s+before|this\s+(?:morning|afternoon|evening)|"
        r"last\s+night)\b",
        re.IGNORECASE,
    ),
    re.compile(
        r"\b(?:last|this|next|past|previous|coming|upcoming|few|couple|early|late)\s+"
        r"(?:days?|weeks?|weekends?|months?|years?|summer|winter|spring|fall|autumn|"
        r"Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)\b",
        re.IGNORECASE,
    ),
    re.compile(
        r"\b(?:last|this|next|past|previous|coming)\s+"
        r"(?-i:Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)\b",
        re.IGNORECASE,
    ),
    _N_UNITS_AGO,
    re.compile(r"\bago\b", re.IGNORECASE),
    re.compile(
        rf"\bfor\s+(?:the\s+(?:last|past)\s+|{_ABOUT}\s+)?{_NUMBER_WORDS}\s+{_UNIT}\b",
        re.IGNORECASE,
    ),
    re.compile(rf"\b{_NUMBER_WORDS}\s+{_UNIT}\s+now\b", re.IGNORECASE),
    re.compile(r"\bon\s+the\s+\d{1,2}(?:st|nd|rd|th)\b", re.IGNORECASE),
    re.compile(r"\b(?:over|on|at|during)\s+the\s+weekend\b", re.IGNORECASE),
    re.compile(rf"\b{_WEEKDAY}\b"),
    re.compile(
        r"\b(?:January|February|March|April|June|July|August|September|October|"
        r"November|December)\b"
    ),
    re.compile(
        r"\bMay\s+\d{1,2}\b|\b\d{1,2}(?:st|nd|rd|th)?\s+(?:of\s+)?May\b|"
        r"\b(?:in|of|since|until|early|late|mid|last|next|this)\s+May\b"
    ),
    re.compile(r"\b(?:19|20)\d{2}\b"),
    re.compile(r"\bsince\b", re.IGNORECASE),
]

# The same rules as one pattern, the case-insensitive ones in one ``(?i:...)`` group:
# a text matches it exactly when it matches one of the list (alternation), in one scan
# instead of fourteen (about half the time on LoCoMo turns; every appended turn pays it).
# "N units ago" is left out: every text it matches, the rule for "ago" matches.
_TIME_EXPRESSION = re.compile(
    "(?i:"
    + "|".join(rx.pattern for rx in _TIME_EXPRESSIONS if rx.flags & re.I and rx is not _N_UNITS_AGO)
    + ")|"
    + "|".join(rx.pattern for rx in _TIME_EXPRESSIONS if not rx.flags & re.I)
)

# Every rule above needs one of these in the text (case-insensitively one of the
# words; case-sensitively a weekday's or month's first three letters; or a year or
# a day number, :data:`_DIGIT_RULES`), so an
# ASCII text without any is scored without running the pattern, which tries its
# alternatives at every position (about 30 us a turn; most turns hold none). ASCII
# only, because there ``str.lower`` folds exactly as ``re.IGNORECASE`` does (which
# also matches a few non-ASCII letters, such as the long s, with ASCII ones); the
# tagger's pending-point prefilter (``server._tagger``) follows the same rule.
_ANY_CASE_WORDS = (
    "day", "night", "tomorrow", "recently", "lately", "morning", "afternoon", "evening",
    "week", "month", "year", "decade", "summer", "winter", "spring", "fall", "autumn",
    "ago", "since",
)  # fmt: skip
_CAPITALISED = (
    "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun",
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
)  # fmt: skip
_DIGITS = frozenset("0123456789")
# The rules a digit can satisfy without any of the words above: a year 1900-2099
# ("(19|20)dd") and a day number "on the 15th". A text with digits but neither
# (a price, a count, "item 7") needs no scan of the whole pattern, which costs
# about 6 ms on a 16 KiB turn and holds the interpreter lock all along
# (``bench/bench_overload.py``'s large appends: half the lock's time went there).
_DIGIT_RULES = re.compile(r"(?:19|20)\d\d|\d(?:st|nd|rd|th)", re.IGNORECASE)


def _may_hold_time_expression(text: str) -> bool:
    """False only for a text that no rule of :data:`_TIME_EXPRESSION` can match."""
    if not text.isascii():
        return True
    if any(w in text for w in _CAPITALISED):
        return True
    low = text.lower()
    if any(w in low for w in _ANY_CASE_WORDS):
        return True
    return not _DIGITS.isdisjoint(text) and _DIGIT_RULES.search(text) is not None


def asks_when(question: str) -> bool:
    """Whether a question asks when something happened or how long it lasted.

    English-only rules (module docstring): the question starts with "when", "since
    when", "how long", "what/which year|month|day|date|week|season|time", "how many
    days|weeks|months|years", "how old" or "at what age" (after an optional "and",
    "so", "but", "in", "on", "at", "by", "from", "until"), or holds "how long ago"
    or "what date" anywhere.

    Args:
        question: The query text.

    Returns:
        True for a when- or how-long question; False otherwise (also for non-English).
    """
    return bool(_ASKS_WHEN.search(question) or _HOW_LONG_AGO.search(question))


def time_expression_score(text: str) -> float:
    """How strongly a turn's text anchors something in time.

    English-only rules (module docstring): yesterday, today, tonight, tomorrow,
    recently, "the other day"; last/this/next/past + week, weekend, month, year,
    season or weekday (also a capitalised abbreviation: "last Fri"); "N
    days/weeks/months/years ago" (N a numeral, a number word, "a few", "a couple
    of", "several") and any "ago"; "for (the past | about | over | nearly …) N
    weeks" and "N years now"; "on the 15th"; "over (on, at, during) the weekend";
    a capitalised weekday or month name ("May" only beside a day number or after
    "in", "of", "since", …); a year 1900-2099; "since".

    Args:
        text: A turn's text.

    Returns:
        ``1.0`` if the text holds at least one time expression, else ``0.0``.
    """
    if not _may_hold_time_expression(text):
        return 0.0
    return 1.0 if _TIME_EXPRESSION.search(text) else 0.0


@dataclass(frozen=True, slots=True)
class NamedPeriod:
    """A period a question names: a day, a month or a year (UTC, half-open).

    Attributes:
        start: First second of the period, seconds since the Unix epoch.
        end: First second after it.
        granularity: ``"day"``, ``"month"`` or ``"year"``.
    """

    start: float
    end: float
    granularity: str


_ORD = r"(?:st|nd|rd|th)?"
# Day-month-year and month-day-year, year optional: "7 May 2023", "7th of May, 2023",
# "May 7, 2023", "May 7th".
_DAY_FIRST = re.compile(rf"\b(\d{{1,2}}){_ORD}\s+(?:of\s+)?({_MONTH_RE})\b,?(?:\s+(\d{{4}}))?")
_MONTH_FIRST = re.compile(rf"\b({_MONTH_RE})\s+(\d{{1,2}}){_ORD}\b(?!\s*:)(?:,?\s+(\d{{4}}))?")
# Month and year: "May 2023", "May, 2023"; a month alone after a preposition.
_MONTH_YEAR = re.compile(rf"\b({_MONTH_RE}),?\s+(\d{{4}})\b")
_MONTH_ALONE = re.compile(
    rf"\b(?:in|during|of|since|until|till|by|early|late|mid|mid-|before|after|"
    rf"last|this|next|beginning\s+of|end\s+of|middle\s+of)\s+({_MONTH_RE})\b(?!\s+\d)",
    re.IGNORECASE,
)
_YEAR = re.compile(r"\b((?:19|20)\d{2})\b")
# A question can name a date only if it holds a digit or a month name: one scan
# decides for most questions.
_MAY_NAME = re.compile(rf"\d|\b{_MONTH_RE}\b", re.IGNORECASE)


def _month_period(year: int, month: int) -> NamedPeriod:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return NamedPeriod(start.timestamp(), end.timestamp(), "month")


def _day_period(year: int, month: int, day: int) -> NamedPeriod | None:
    try:
        start = datetime(year, month, day, tzinfo=UTC)
    except ValueError:  # "31 February"
        return None
    return NamedPeriod(start.timestamp(), start.timestamp() + 86400.0, "day")


def named_periods(question: str, years: range) -> list[NamedPeriod]:
    """The days, months and years a question names.

    English-only rules (module docstring): "7 May 2023", "7th of May, 2023", "May 7,
    2023" and, without a year, "May 7th" (a day); "May 2023" and, without a year, a
    month after "in", "during", "of", "since", "early", "late", "beginning of", …
    (a month); a year 1900-2099 not already part of a day or a month (a year). A day
    or month without a year names that day or month in each of ``years``.

    Args:
        question: The query text.
        years: The calendar years a date without a year may fall in (e.g. those the
            owner's turns span); empty to ignore such dates.

    Returns:
        The named periods in order of appearance, without duplicates; empty when the
        question names none.
    """
    if not _MAY_NAME.search(question):
        return []
    found: list[tuple[int, NamedPeriod]] = []
    taken: list[tuple[int, int]] = []

    def free(m: re.Match[str]) -> bool:
        return all(m.end() <= a or m.start() >= b for a, b in taken)

    def claim(m: re.Match[str], periods: list[NamedPeriod | None]) -> None:
        taken.append((m.start(), m.end()))
        found.extend((m.start(), p) for p in periods if p is not None)

    for rx, day_group, month_group in ((_DAY_FIRST, 1, 2), (_MONTH_FIRST, 2, 1)):
        for m in rx.finditer(question):
            if not free(m):
                continue
            month = _MONTHS[m.group(month_group).lower()]
            day = int(m.group(day_group))
            if not 1 <= day <= 31:
                continue
            if m.group(3):
                claim(m, [_day_period(int(m.group(3)), month, day)])
            else:
                claim(m, [_day_period(y, month, day) for y in years])
    for m in _MONTH_YEAR.finditer(question):
        if free(m):
            claim(m, [_month_period(int(m.group(2)), _MONTHS[m.group(1).lower()])])
    for m in _MONTH_ALONE.finditer(question):
        name = m.group(1)
        if not free(m) or (name.lower() == "may" and not name[0].isupper()):
            continue
        claim(m, [_month_period(y, _MONTHS[name.lower()]) for y in years])
    for m in _YEAR.finditer(question):
        if free(m):
            year = int(m.group(1))
            start = datetime(year, 1, 1, tzinfo=UTC).timestamp()
            end = datetime(year + 1, 1, 1, tzinfo=UTC).timestamp()
            claim(m, [NamedPeriod(start, end, "year")])
    found.sort(key=lambda item: item[0])
    return list(dict.fromkeys(p for _, p in found))
