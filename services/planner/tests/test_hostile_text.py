"""The planner on hostile queries and model replies: quoted spans found as the replaced regex
found them (kept here as the oracle), in linear time; whole plans for hostile queries at the
length limit come back quickly and well formed."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.planner import llm as llm_planner
from services.planner import text as planner_text
from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.keywords import MAX_KEYWORD_CHARS, extract_keywords
from services.planner.plan import PlanInput
from services.planner.strategy import choose_strategy
from services.planner.text import quoted_phrases, split_quoted, tokens, without_quoted
from services.planner.variations import make_variations

MEGABYTE = 1_000_000
QUERY_LIMIT = 16_000  # planner_max_query_chars
BOUND_S = 10.0

OLD_QUOTED = re.compile(
    r'"(?P<d>[^"\n]+)"'
    "|\u201c(?P<c>[^\u201d\n]+)\u201d"
    "|\u2018(?P<cs>[^\u2019\n]+)\u2019"
    r"|`(?P<b>[^`\n]+)`"
    r"|(?<![\w'])'(?P<s>[^'\n]+)'(?![\w'])"
)

QUOTE_PIECES = ['"', "'", "`", "\u201c", "\u201d", "\u2018", "\u2019", "a", " ", "\n", "_", ".", "b'", "'s"]
QUERY_PIECES = [
    " ",
    "\t",
    '"',
    "'",
    "`",
    "\u201c",
    "\u2018",
    "(",
    "[",
    "?",
    ".",
    ",",
    "-",
    "_",
    "/",
    "IL-6",
    "ERR_CONN_RESET",
    "What is",
    "list all",
    "and",
    "Stanford University",
    "v1.2.3",
    "\u00e9",
    "\n",
]


def hostile_query(max_chars: int = QUERY_LIMIT) -> st.SearchStrategy[str]:
    run = st.tuples(st.sampled_from(QUERY_PIECES), st.one_of(st.integers(1, 4), st.integers(100, 1000)))
    text = st.lists(run, min_size=1, max_size=8).map(lambda rs: "".join(p * n for p, n in rs))
    return text.map(lambda q: q[:max_chars]).filter(lambda q: q.strip() != "")


@settings(max_examples=800, deadline=None)
@given(st.lists(st.sampled_from(QUOTE_PIECES), max_size=20).map("".join))
def test_quoted_spans_match_the_old_pattern(query: str) -> None:
    matches = list(OLD_QUOTED.finditer(query))
    assert planner_text.quoted_spans(query) == [m.span() for m in matches]
    assert without_quoted(query) == OLD_QUOTED.sub(" , ", query)
    bodies = [" ".join(next(g for g in m.groups() if g is not None).split()) for m in matches]
    assert quoted_phrases(query) == [b for b in bodies if b]
    assert [s.text for s in split_quoted(query) if s.quoted] == [b for b in bodies if b]


QUARTER = MEGABYTE // 4


@pytest.mark.parametrize(
    "query",
    [
        "\u201c" * QUARTER,
        "\u2018" * QUARTER,
        "\u201c" + "a" * MEGABYTE,
        " '" * (QUARTER // 2),
        '"' * QUARTER,
        "`a" * (QUARTER // 2),
        "x'y " * (QUARTER // 4),
    ],
)
def test_quoted_spans_take_linear_time(query: str) -> None:
    started = time.perf_counter()
    quoted_phrases(query)
    without_quoted(query)
    split_quoted(query)
    assert time.perf_counter() - started < BOUND_S


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_query())
def test_plans_for_hostile_queries_are_quick_and_well_formed(query: str) -> None:
    planner = DeterministicPlanner(PoolSizes(50, 80), max_keywords=8)
    started = time.perf_counter()
    plan = planner.plan_sync(PlanInput(query=query, strategy=None, max_variations=8, hyde_mode=None))
    assert time.perf_counter() - started < 1.0
    assert plan.variations[0] == query.strip()
    assert len(plan.hard_keywords) <= 8
    assert all(0 < len(k) <= MAX_KEYWORD_CHARS for k in plan.hard_keywords)


@pytest.mark.parametrize(
    "text",
    [
        "\u201c" * QUARTER,
        "list all " * (QUARTER // 9),
        "sum" + " " * MEGABYTE + "x",
        "a_" * (MEGABYTE // 2),
        "1." * (MEGABYTE // 2),
        "A" * MEGABYTE + "1",
        "?" + " " * MEGABYTE + "x",
    ],
)
def test_planning_rules_take_linear_time_even_past_the_query_limit(text: str) -> None:
    started = time.perf_counter()
    extract_keywords(text, 8)
    make_variations(text, 8)
    choose_strategy(text, has_specific_terms=False)
    assert time.perf_counter() - started < 3 * BOUND_S


def test_model_keywords_too_long_to_use_are_dropped_before_matching() -> None:
    query = "error " * 300 + "ERR_CONN_RESET in module core"
    suggested = ["error " * 40 + f"x{i}" for i in range(2000)] + ["module core", "ERR_CONN_RESET"]
    started = time.perf_counter()
    found = [llm_planner._in_query(query, keyword) for keyword in suggested]
    assert time.perf_counter() - started < 2.0
    assert found[-2:] == ["module core", "ERR_CONN_RESET"]
    assert not any(found[:-2])
    assert llm_planner._in_query(query, "a " * 6) == ""  # more words than a keyword may have


def test_keyword_words_are_counted_like_the_final_check() -> None:
    # Punctuation-only "words" are not tokens: five tokens with a comma between still qualify.
    query = "alpha beta , gamma delta epsilon"
    assert len(tokens(query)) == 5
    assert llm_planner._in_query(query, query) == query
    assert llm_planner._usable_keyword(query)


def test_a_query_at_the_limit_plans_quickly_and_prompts_quote_its_opening() -> None:
    from meshkit.settings import PlannerSettings
    from services.planner.hyde import PROMPT_QUERY_CHARS, hyde_messages

    assert PlannerSettings().planner_max_query_chars == QUERY_LIMIT
    sentence = "Which retrieval methods rank IL-6 studies on \u201cbone density\u201d (v1.2.3)? "
    query = (sentence * 300)[:QUERY_LIMIT]
    planner = DeterministicPlanner(PoolSizes(50, 80), max_keywords=8)
    started = time.perf_counter()
    plan = planner.plan_sync(PlanInput(query=query, strategy=None, max_variations=8, hyde_mode=None))
    assert time.perf_counter() - started < 1.0
    assert plan.variations[0] == query.strip()
    for messages in (llm_planner.plan_messages(query, 3, 8, True), hyde_messages(query)):
        prompt = messages[-1]["content"]
        assert query[:100] in prompt and len(prompt) < PROMPT_QUERY_CHARS + 600
