"""Follow-up questions rewritten into standalone queries, without a language model.

"and for the staging cluster?" means nothing to an index; after "How is the production cluster
configured?" it means "staging cluster configured". The rewrite keeps a *topic*: the content
words of the user's last standalone question, updated by each follow-up after it. Assistant
turns are not read: an answer's words would drown the question's.

A question is a follow-up when the conversation has a user turn before it and
- it opens with a continuation ("and ...", "what about ...", "how about ...", "same for ...")
  and has at most ``CUE_MAX_OWN_WORDS`` content words of its own, or
- it points back ("it", "that", "those", "the same") and has at most ``ANAPHOR_MAX_OWN_WORDS``,
- or it has no content word at all ("why?").
Anything else is standalone and searched as asked, so a new topic is never polluted by the old.

A follow-up's own words change the topic: a phrase sharing a word with it replaces that part
("staging cluster" over "production cluster"), a name replaces the topic's last name ("Java"
over "Python"), and anything else is added. The searched query is the topic's words in order.

Bounds: the servicer caps the history's turns and characters; the rules read the query and at
most the first ``MAX_TURN_CHARS`` of the last ``MAX_TOPIC_TURNS`` user turns, each once with the
planner's tokenizer (linear), the topic holds at most ``MAX_TOPIC_WORDS`` words of
at most ``MAX_WORD_CHARS`` characters, so a rewrite is at most ``MAX_REWRITE_CHARS`` long.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.planner.keywords import names_something
from services.planner.plan import Turn
from services.planner.text import Token, tokens, word_set
from services.planner.variations import content_runs

MAX_TOPIC_WORDS = 12
# Longer "words" are pasted data, not a topic.
MAX_WORD_CHARS = 64
CUE_MAX_OWN_WORDS = 5
ANAPHOR_MAX_OWN_WORDS = 3
MAX_REWRITE_CHARS = MAX_TOPIC_WORDS * (MAX_WORD_CHARS + 1)
# Only the last few user turns can hold the topic a follow-up leans on, and a question is short:
# reading no more keeps a plan's cost flat however long the conversation.
MAX_TOPIC_TURNS = 4
MAX_TURN_CHARS = 2000

# Anchored and without nested repetition: one linear pass at most over the query's start.
_CONTINUATION = re.compile(
    r"""[^\w]{0,8}(?:
        and | but | or | also | plus | then | so
      | (?:what|how)\s+about | what\s+if | as\s+for
      | (?:the\s+)?same\s+(?:for|with|about|question)
      | likewise | similarly | ditto
    )\b""",
    re.IGNORECASE | re.VERBOSE,
)
# Words that point back at the conversation.
_ANAPHORS = word_set(
    """
    it its it's itself that this these those they them their theirs there same former latter
    one ones such above aforementioned
    """
)

Topic = list[list[Token]]


def standalone_query(query: str, history: Sequence[Turn]) -> str:
    """``query`` as a standalone search: itself unless it is a follow-up of ``history``'s user
    turns, else the conversation's topic updated with the follow-up's own words."""
    topic = conversation_topic(history)
    own = _own_runs(query)
    if not topic or not is_follow_up(query, own):
        return query
    return _render(_merge(topic, own)) or query


def conversation_topic(history: Sequence[Turn]) -> Topic:
    """The topic at the end of ``history``: each of the last user turns starts a new one or, as
    a follow-up, updates the current one."""
    topic: Topic = []
    for turn in [t for t in history if t.user][-MAX_TOPIC_TURNS:]:
        text = turn.content[:MAX_TURN_CHARS]
        own = _own_runs(text)
        if topic and is_follow_up(text, own):
            topic = _merge(topic, own)
        elif own:
            topic = _bounded(own)
    return topic


def is_follow_up(query: str, own: Topic) -> bool:
    """Whether ``query`` (whose content runs are ``own``) leans on the conversation."""
    words = sum(len(run) for run in own)
    if words == 0:
        return True
    if words <= CUE_MAX_OWN_WORDS and _CONTINUATION.match(query):
        return True
    return words <= ANAPHOR_MAX_OWN_WORDS and any(t.lower in _ANAPHORS for t in tokens(query))


def _own_runs(text: str) -> Topic:
    """The content runs of ``text``, without words that only point back ("same", "one") and
    without over-long "words"."""
    runs: Topic = []
    for run in content_runs(text):
        kept = [t for t in run if t.lower not in _ANAPHORS and len(t.text) <= MAX_WORD_CHARS]
        if kept:
            runs.append(kept)
    return runs


def _merge(topic: Topic, own: Topic) -> Topic:
    merged = [list(run) for run in topic]
    added: Topic = []
    for run in own:
        if not _align(merged, run) and not _swap_name(merged, run):
            added.append(run)
    return _bounded([*merged, *added], keep_last=len(added))


def _align(topic: Topic, run: list[Token]) -> bool:
    """Put ``run`` in place of the topic words it contrasts with: its last word that the topic
    holds anchors it, and the words before that anchor replace as many before it in the topic
    ("staging cluster" over "production cluster configured" gives "staging cluster
    configured"). False when the topic shares no word with ``run``."""
    where = {token.lower: (i, j) for i, topic_run in enumerate(topic) for j, token in enumerate(topic_run)}
    for k in range(len(run) - 1, -1, -1):
        found = where.get(run[k].lower)
        if found is None:
            continue
        i, j = found
        old = topic[i]
        topic[i] = [*old[: max(0, j - k)], *run[: k + 1], *old[j + 1 :], *run[k + 1 :]]
        return True
    return False


def _swap_name(topic: Topic, run: list[Token]) -> bool:
    """A run of names ("Java") replaces the topic's last run of names ("Python")."""
    if not all(names_something(t) for t in run):
        return False
    for i in range(len(topic) - 1, -1, -1):
        old = topic[i]
        names = [j for j, t in enumerate(old) if names_something(t)]
        if names:
            start, end = names[0], names[-1]
            topic[i] = [*old[:start], *run, *old[end + 1 :]]
            return True
    return False


def _bounded(topic: Topic, keep_last: int = 0) -> Topic:
    """At most ``MAX_TOPIC_WORDS`` words: the first ones, except that the last ``keep_last``
    runs (the follow-up's own additions) are kept first."""
    tail = topic[len(topic) - keep_last :] if keep_last else []
    head = topic[: len(topic) - keep_last] if keep_last else topic
    budget = MAX_TOPIC_WORDS
    kept_tail: Topic = []
    for run in tail:
        if budget <= 0:
            break
        kept_tail.append(run[:budget])
        budget -= len(kept_tail[-1])
    kept_head: Topic = []
    for run in head:
        if budget <= 0:
            break
        kept_head.append(run[:budget])
        budget -= len(kept_head[-1])
    return [*kept_head, *kept_tail]


def _render(topic: Topic) -> str:
    """The topic's words in order, each once (case-insensitive)."""
    words: dict[str, str] = {}
    for run in topic:
        for token in run:
            words.setdefault(token.lower, token.text)
    return " ".join(words.values())
