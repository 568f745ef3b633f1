"""Evidence at sentence level, judged by the cross-encoder (pure rules; judge.py makes the calls).

An answer is only as good as the sentences it states, and the bi-encoder that used to pick them
scores topic, not evidence. The reranker tier's cross-encoder was trained to score a claim
against the text that supports or refutes it, so it scores:
- each candidate sentence of the passages read against the question (which sentences are the
  evidence, which passages to cite, and whether anything answers at all: the evidence gate);
- each sentence of an answer (or extracted fact) against the sentences of the passages it cites
  (support: a sentence its passages do not support is rebound to one that does, or dropped).

The pairs are bounded (passages read, sentences per passage, pairs per call) so an Ask costs a
known number of short model runs. The thresholds are log-odds on the reranker's calibrated
scale, chosen on SciFact train claims and off-domain questions (bench/answer_tune.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshkit.text.answering import content_words, coverage, strip_citations
from meshkit.text.evidence import passage_sentences

# Longest sentence sent to the cross-encoder: a "sentence" that long is a table or a code block
# the splitter could not break, and the model reads only its first 256 tokens anyway.
MAX_SENTENCE_CHARS = 600
# Sentences of each cited passage an answer sentence is scored against before any other's.
PREFERRED_PAIRS = 6
# Words compared by their first letters in the support filter, so "reduces" meets "reduced" and
# "fracture" meets "fractures" (an answer restates, it rarely quotes).
STEM_CHARS = 5


@dataclass(frozen=True)
class Candidate:
    """A sentence of the passage read at ``passage`` (0-based), ``position`` in that passage."""

    passage: int
    position: int
    text: str


@dataclass(frozen=True)
class Scored:
    candidate: Candidate
    # The cross-encoder's log-odds that the sentence is evidence for the question.
    score: float

    @property
    def passage(self) -> int:
        return self.candidate.passage

    @property
    def text(self) -> str:
        return self.candidate.text


@dataclass(frozen=True)
class SelectionRules:
    """How sentences become an answer (see select); defaults are GatewaySettings'."""

    # Evidence gate: the strongest passage's strength (see sentence_weight) plus
    # gate_coverage_weight times the share of the question's content words the passages read
    # hold, minus gate_unknown_weight times the share no document of the collection holds, must
    # reach gate_min_score. The words carry the verdict to corpora the cross-encoder was not
    # trained on (it is confident about questions it has never seen the like of); a word the
    # whole collection lacks says more than one the passages read lack (they may paraphrase it),
    # and it is what a near miss ("... over QUIC?" asked of HTTP/2 docs) has.
    gate_min_score: float
    gate_coverage_weight: float
    gate_unknown_weight: float
    # Facts: sentences scoring at least fact_min_score, at most max_facts, best first by their
    # score plus fact_passage_weight times their passage's: a weaker sentence of a passage the
    # reranker trusts is more often evidence than a stronger one of a passage it doubts.
    fact_min_score: float
    max_facts: int
    # Citations: passages whose strength (their own score plus sentence_weight times their best
    # sentence's) is within cite_margin of the strongest's. The passage score (the reranker read
    # the whole passage) ranks the gold document first more often than the best sentence alone.
    sentence_weight: float
    cite_margin: float
    max_cited_passages: int
    # Sentences stated per cited passage: its best, and those within sentence_margin of it.
    sentences_per_passage: int
    sentence_margin: float
    # Topicality floor: the bi-encoder's best cosine between the question and any passage of
    # the collection must reach this (-1: off). The cross-encoder scores a sentence against the
    # question, not the collection against it: it finds "Lyme disease is emerging in Canada"
    # worth quoting for "What is the capital of Canada?". A question no passage is near in
    # embedding space is not about these documents, whatever a sentence shares with it.
    gate_min_similarity: float = -1.0
    fact_passage_weight: float = 0.0
    # The gate subtracts gate_novel_weight times the share of the question's content words that
    # no document holds nor anything one edit from them, on top of gate_unknown_weight: a
    # misspelling ("reatment") of what the documents say is still answerable; a subject they
    # never mention ("Elixir" asked of gRPC's docs) is not, however sure the cross-encoder is
    # of a passage about gRPC servers.
    gate_novel_weight: float = 0.0
    # Subtracted once when the question holds any unknown word, whatever its share: in effect a
    # higher gate_min_score for such questions only. A near miss names one missing subject
    # among many words the documents hold ("... to Datadog?"), so its share is small; a question
    # whose every word the collection holds is asked of these documents, and the cross-encoder
    # doubts many gold abstracts a claim paraphrases, so its doubt alone should refuse little.
    gate_unknown_penalty: float = 0.0


@dataclass
class Selection:
    answered: bool
    # Accepted evidence sentences, best first.
    facts: list[Scored]
    # What the answer states, in reading order: cited passages by their best sentence, each
    # passage's sentences in the order the passage has them.
    answer: list[Scored]
    # The gate's evidence score (see SelectionRules); None when no sentence was scored.
    evidence_score: float | None
    question_coverage: float
    # Share of the question's content words no document of the collection holds.
    unknown_share: float = 0.0
    # The best cosine of the question to any passage (None: the dense leg did not answer), and
    # whether the gate refused for being under the topicality floor.
    similarity: float | None = None
    off_topic: bool = False
    # Share of the question's content words that are no misspelling of an indexed word either
    # (see SelectionRules.gate_novel_weight).
    novel_share: float = 0.0


def candidates(
    query: str,
    passages: Sequence[tuple[str, str]],
    *,
    max_passages: int,
    max_sentences: int,
    max_pairs: int,
) -> list[Candidate]:
    """The sentences worth scoring: those of the first ``max_passages`` passages (title, text),
    at most ``max_sentences`` per passage and ``max_pairs`` in all. When there are more, the
    ones sharing most content words with the question are kept (the cheap first filter), ties
    going to the better passage and the earlier sentence."""
    found: list[Candidate] = []
    for index, (title, text) in enumerate(passages[:max_passages]):
        sentences = passage_sentences(text, title)[:max_sentences]
        found.extend(Candidate(index, i, s[:MAX_SENTENCE_CHARS]) for i, s in enumerate(sentences))
    if len(found) <= max_pairs:
        return found
    ranked = sorted(found, key=lambda c: (-coverage(query, c.text), c.passage, c.position))[:max_pairs]
    return sorted(ranked, key=lambda c: (c.passage, c.position))


def _stems(text: str) -> set[str]:
    return {w[:STEM_CHARS] for w in content_words(text)}


def stem_coverage(part: str, whole: str) -> float:
    """Share of ``part``'s content words (by their first STEM_CHARS letters) found in ``whole``."""
    wanted = _stems(part)
    return len(wanted & _stems(whole)) / len(wanted) if wanted else 1.0


def question_coverage(query: str, texts: Sequence[str]) -> float:
    """Share of the question's content words found in any of ``texts``."""
    words = content_words(query)
    if not words:
        return 1.0
    seen: set[str] = set()
    for text in texts:
        seen |= content_words(text)
    return len(words & seen) / len(words)


def unknown_share(query: str, terms: Sequence[str]) -> float:
    """Share of the question's content words among ``terms`` (words the BM25 leg found no
    document of the collection holds: its unknown_terms, or their novel_terms)."""
    words = content_words(query)
    return len(words & {t.lower() for t in terms}) / len(words) if words else 0.0


def is_off_topic(similarity: float | None, rules: SelectionRules) -> bool:
    """Whether the question's best dense cosine is under the topicality floor (unknown: no)."""
    return similarity is not None and similarity < rules.gate_min_similarity


def select(
    query: str,
    scored: Sequence[Scored],
    texts: Sequence[str],
    passage_scores: Sequence[float],
    rules: SelectionRules,
    unknown_terms: Sequence[str] = (),
    similarity: float | None = None,
    novel_terms: Sequence[str] = (),
    words_checked: bool = True,
) -> Selection:
    """The gate's verdict, the facts and the answer's sentences from the scored candidates of
    passages whose texts are ``texts`` and whose own scores are ``passage_scores`` (by passage
    index); ``unknown_terms``: the question's words no document of the collection holds;
    ``similarity``: the dense leg's best cosine for the question (None: not known, no floor);
    ``novel_terms``: those of ``unknown_terms`` no indexed word is one edit from;
    ``words_checked``: whether the BM25 leg looked the words up at all. When it did not (sparse
    down), a near miss cannot be told by its words, and every question meets the gate raised by
    gate_unknown_penalty."""
    ranked = sorted(scored, key=lambda s: (-s.score, s.passage, s.candidate.position))
    share = question_coverage(query, texts)
    unknown = unknown_share(query, unknown_terms)
    novel = unknown_share(query, novel_terms)
    if is_off_topic(similarity, rules):
        return Selection(False, [], [], None, share, unknown, similarity, off_topic=True, novel_share=novel)
    if not ranked:
        return Selection(False, [], [], None, share, unknown, similarity, novel_share=novel)
    best_sentence: dict[int, float] = {}
    for item in ranked:
        best_sentence.setdefault(item.passage, item.score)
    strength = {p: passage_scores[p] + rules.sentence_weight * top for p, top in best_sentence.items()}
    strongest = max(strength.values())
    evidence = (
        strongest
        + rules.gate_coverage_weight * share
        - rules.gate_unknown_weight * unknown
        - rules.gate_novel_weight * novel
        - (rules.gate_unknown_penalty if unknown or not words_checked else 0.0)
    )
    if evidence < rules.gate_min_score:
        return Selection(False, [], [], evidence, share, unknown, similarity, novel_share=novel)
    facts = _facts(ranked, passage_scores, rules) or ranked[:1]
    cited = sorted(
        (p for p in strength if strength[p] >= strongest - rules.cite_margin),
        key=lambda p: (-strength[p], p),
    )[: rules.max_cited_passages]
    answer: list[Scored] = []
    for passage in cited:
        own = [s for s in ranked if s.passage == passage]
        top = own[0].score
        chosen = [s for s in own if s.score >= top - rules.sentence_margin][: rules.sentences_per_passage]
        answer.extend(sorted(chosen, key=lambda s: s.candidate.position))
    return Selection(True, facts, answer, evidence, share, unknown, similarity, novel_share=novel)


def _facts(ranked: list[Scored], passage_scores: Sequence[float], rules: SelectionRules) -> list[Scored]:
    """The sentences over the fact floor, best first by their own and their passage's score
    (ties keep ``ranked``'s order: sorted is stable), at most max_facts."""
    weight = rules.fact_passage_weight
    kept = [s for s in ranked if s.score >= rules.fact_min_score]
    kept.sort(key=lambda s: -(s.score + weight * passage_scores[s.passage]))
    return kept[: rules.max_facts]


@dataclass(frozen=True)
class SupportRules:
    # A sentence is supported by a passage when one of the passage's sentences holds at least
    # min_coverage of its content words (the cheap first filter: the cross-encoder scores topic
    # as much as support, and gives "X is common" nearly what it gives "X reduces Y") and scores
    # at least min_score with it (the sentence as the claim, the passage's as the evidence).
    min_score: float
    min_coverage: float
    # Passage sentences scored per answer sentence (the lexically closest first).
    max_pairs: int


def support_candidates(
    sentence: str,
    passage_texts: Sequence[str],
    rules: SupportRules,
    preferred: Sequence[int] = (),
) -> list[Candidate]:
    """The passage sentences to score an answer sentence against: those holding at least
    ``rules.min_coverage`` of its content words, at most ``rules.max_pairs``: the
    PREFERRED_PAIRS closest of each ``preferred`` passage (the ones it cites), then the closest
    of every passage, then the closest of all. None: nothing read can support it."""
    body = strip_citations(sentence)
    max_pairs = rules.max_pairs
    per_passage: list[list[Candidate]] = []
    for index, text in enumerate(passage_texts):
        own = [Candidate(index, i, s[:MAX_SENTENCE_CHARS]) for i, s in enumerate(passage_sentences(text))]
        close = [(c, stem_coverage(body, c.text)) for c in own]
        close = [(c, share) for c, share in close if share >= rules.min_coverage]
        per_passage.append([c for c, _ in sorted(close, key=lambda pair: (-pair[1], pair[0].position))])
    order = [
        *(c for p in preferred if 0 <= p < len(per_passage) for c in per_passage[p][:PREFERRED_PAIRS]),
        *(own[0] for own in per_passage if own),
        *sorted(
            (c for own in per_passage for c in own[1:]),
            key=lambda c: (-stem_coverage(body, c.text), c.passage, c.position),
        ),
    ]
    chosen: list[Candidate] = []
    for candidate in order:
        if len(chosen) == max_pairs:
            break
        if candidate not in chosen:
            chosen.append(candidate)
    return chosen


def best_support(scored: Sequence[Scored]) -> dict[int, float]:
    """Per passage index, the best score among its scored sentences."""
    best: dict[int, float] = {}
    for item in scored:
        if item.passage not in best or item.score > best[item.passage]:
            best[item.passage] = item.score
    return best
