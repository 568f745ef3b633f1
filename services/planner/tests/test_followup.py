"""Follow-up questions rewritten into standalone queries by the rules: follow-ups get the
conversation's topic, standalone questions stay as asked, and hostile or huge conversations
are read in linear time into a bounded rewrite."""

from __future__ import annotations

import time

import pytest

from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.followup import MAX_REWRITE_CHARS, MAX_TOPIC_WORDS, standalone_query
from services.planner.plan import PlanInput, Strategy, Turn

PLANNER = DeterministicPlanner(PoolSizes(precise=50, exhaustive=80), max_keywords=4)
PRODUCTION = "How is the production cluster configured?"


def user(text: str) -> Turn:
    return Turn(user=True, content=text)


def assistant(text: str) -> Turn:
    return Turn(user=False, content=text)


@pytest.mark.parametrize(
    ("history", "follow_up", "expected"),
    [
        # A phrase sharing a word with the topic replaces that part of it.
        (
            [user(PRODUCTION), assistant("It runs five nodes behind a load balancer [1].")],
            "and for the staging cluster?",
            "staging cluster configured",
        ),
        # A name replaces the topic's name.
        (
            [user("How do I install the client library for Python?")],
            "what about Java?",
            "install client library Java",
        ),
        # Pointing back with a word of its own: the topic, plus that word.
        (
            [user("What is server reflection in gRPC?")],
            "does it support that?",
            "server reflection gRPC support",
        ),
        ([user(PRODUCTION)], "why?", "production cluster configured"),
        ([user(PRODUCTION)], "How are they backed up?", "production cluster configured backed"),
        # A chain: each follow-up updates the topic the next one leans on.
        (
            [user(PRODUCTION), assistant("Five nodes [1]."), user("And the staging cluster?")],
            "what about its backups?",
            "staging cluster configured backups",
        ),
        # Assistant turns do not set the topic.
        (
            [user(PRODUCTION), assistant("Kafka and Postgres run there [1].")],
            "and the same for staging?",
            "production cluster configured staging",
        ),
    ],
)
def test_a_follow_up_carries_the_conversations_topic(
    history: list[Turn], follow_up: str, expected: str
) -> None:
    assert standalone_query(follow_up, history) == expected


@pytest.mark.parametrize(
    "question",
    [
        "What is Kubernetes?",
        # Pointing words inside a question with enough words of its own.
        "Which drugs that reduce fever are safe for children?",
        "And how does the staging cluster handle failover of the primary database?",
        "Does vitamin D supplementation reduce the risk of fractures?",
        "list all the ports that the gateway listens on",
    ],
)
def test_a_standalone_question_is_searched_as_asked(question: str) -> None:
    history = [user(PRODUCTION), assistant("It runs five nodes [1].")]
    assert standalone_query(question, history) == question


@pytest.mark.parametrize(
    "history",
    [[], [assistant("Hello! Ask me about your documents.")], [user("?!"), assistant("Sorry?")]],
)
def test_without_a_topic_a_follow_up_is_left_alone(history: list[Turn]) -> None:
    assert standalone_query("and for the staging cluster?", history) == "and for the staging cluster?"


def test_the_plan_searches_the_rewrite_first() -> None:
    plan = PLANNER.plan_sync(
        PlanInput(
            "what about Java?",
            strategy=None,
            max_variations=3,
            hyde_mode=None,
            history=(user("How do I install the client library for Python?"),),
        )
    )
    assert plan.searched_query == plan.variations[0] == "install client library Java"
    assert plan.hard_keywords == ("Java",)
    assert plan.strategy is Strategy.PRECISE


def test_a_plan_without_history_searches_the_question() -> None:
    plan = PLANNER.plan_sync(PlanInput("and for the staging cluster?", None, 3, None))
    assert plan.searched_query == "and for the staging cluster?"


def _time(history: list[Turn], query: str) -> tuple[float, str]:
    started = time.perf_counter()
    result = standalone_query(query, history)
    return time.perf_counter() - started, result


HOSTILE_TURNS = [
    # One long word, many distinct words, a follow-up chain, pointing words and quotes.
    "x" * 1600,
    " ".join(f"Word{i}" for i in range(260)),
    "and " + "the same cluster " * 100,
    "it that those " * 120,
    '"' * 800 + "'" * 800,
    "\u201c" * 1600,
]


@pytest.mark.parametrize("turn", HOSTILE_TURNS)
def test_hostile_history_is_read_in_linear_time_into_a_bounded_rewrite(turn: str) -> None:
    query = "and what about it?"
    elapsed_small, _ = _time([user(turn[:400])] * 4, query)
    elapsed_large, _ = _time([user(turn)] * 4, query)
    # Four times the text, well under sixteen times the time (quadratic), with slack for noise.
    assert elapsed_large < max(0.05, 8 * elapsed_small)
    # The longest legal conversation (20 turns, 32k characters, or one turn of 32k) costs no
    # more than the last turns the rules read.
    for history in ([user(turn)] * 20, [user(turn * 20)]):
        elapsed, result = _time(history, query)
        assert elapsed < max(0.05, 3 * elapsed_large)
        assert len(result) <= MAX_REWRITE_CHARS
        assert len(result.split()) <= MAX_TOPIC_WORDS


def test_a_huge_topic_is_cut_to_its_first_words_and_the_follow_ups_own() -> None:
    long_question = " ".join(f"term{i}" for i in range(200)) + "?"
    result = standalone_query("and for backups?", [user(long_question)])
    words = result.split()
    assert len(words) == MAX_TOPIC_WORDS
    assert words[0] == "term0" and words[-1] == "backups"
