"""The sentence rules of an Ask (services/gateway/answer/sentences.py, ask.py's pure helpers)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from services.gateway.answer.sentences import (
    Candidate,
    Scored,
    SelectionRules,
    SupportRules,
    candidates,
    select,
    support_candidates,
)
from services.gateway.answer.text import bound_sources, quoted
from services.gateway.validation import TopicalityFloor

RULES = SelectionRules(
    gate_min_score=1.0,
    gate_coverage_weight=6.0,
    gate_unknown_weight=8.0,
    fact_min_score=-1.0,
    max_facts=4,
    sentence_weight=1.0,
    cite_margin=1.0,
    max_cited_passages=2,
    sentences_per_passage=2,
    sentence_margin=1.0,
)
QUERY = "Does vitamin D supplementation reduce hip fractures?"
# The passages' own (reranker) scores: all equal unless a test says otherwise.
EVEN = [0.0, 0.0, 0.0]
TEXTS = [
    "Vitamin D trial. Supplementation with vitamin D reduced hip fractures. Compliance was high. "
    "The reduction held for hip fractures in women.",
    "Vitamin D is made in the skin. Hip fractures are common in the elderly.",
    "An unrelated passage about fractures of bones in horses.",
]


def scored(passage: int, position: int, score: float) -> Scored:
    return Scored(Candidate(passage, position, f"p{passage}s{position}"), score)


def test_several_sentences_of_one_passage_are_stated_in_the_passages_order() -> None:
    chosen = select(
        QUERY,
        [scored(0, 3, 2.5), scored(0, 1, 3.0), scored(0, 2, -0.5), scored(1, 0, 0.2)],
        TEXTS,
        EVEN,
        RULES,
    )
    assert chosen.answered
    # Passage 0's two strong sentences, in passage order; passage 1 is 2.8 behind the best.
    assert [(s.passage, s.candidate.position) for s in chosen.answer] == [(0, 1), (0, 3)]
    # Facts: every sentence over the fact floor, best first.
    assert [s.score for s in chosen.facts] == [3.0, 2.5, 0.2, -0.5]


def test_citations_go_to_passages_close_to_the_best_and_no_more_than_the_cap() -> None:
    many = [scored(0, 0, 3.0), scored(1, 0, 2.5), scored(2, 0, 2.2)]
    chosen = select(QUERY, many, TEXTS, EVEN, RULES)
    assert sorted({s.passage for s in chosen.answer}) == [0, 1]


def test_a_passage_the_reranker_scored_higher_is_cited_before_a_slightly_better_sentence() -> None:
    # Passage 1's best sentence is 0.5 ahead, but the reranker read passage 0 whole and put it
    # 2.0 ahead: passage 0 is the stronger (1.0 + 3.0 against -1.0 + 3.5) and the only one cited.
    chosen = select(QUERY, [scored(0, 0, 3.0), scored(1, 0, 3.5)], TEXTS, [1.0, -1.0, 0.0], RULES)
    assert {s.passage for s in chosen.answer} == {0}


def test_facts_of_a_passage_the_reranker_trusts_come_before_stronger_sentences_of_a_doubted_one() -> None:
    sentences = [scored(0, 0, 3.0), scored(1, 0, 2.0), scored(1, 1, 1.5), scored(0, 1, -1.5)]
    passage_scores = [1.0, -1.0, 0.0]
    # Without the passage weight: by sentence score alone, the floor (-1) dropping -1.5.
    plain = select(QUERY, sentences, TEXTS, passage_scores, RULES)
    assert [s.score for s in plain.facts] == [3.0, 2.0, 1.5]
    # Weight 2: passage 0's sentences gain 2, passage 1's lose 2 (5.0, 0.0, -0.5); the floor
    # still reads the sentence's own score, and the fact keeps it.
    weighted = select(QUERY, sentences, TEXTS, passage_scores, replace(RULES, fact_passage_weight=2.0))
    assert [(s.passage, s.score) for s in weighted.facts] == [(0, 3.0), (1, 2.0), (1, 1.5)]
    weighted = select(
        QUERY, sentences, TEXTS, passage_scores, replace(RULES, fact_passage_weight=2.0, fact_min_score=-2.0)
    )
    assert [(s.passage, s.score) for s in weighted.facts] == [(0, 3.0), (0, -1.5), (1, 2.0), (1, 1.5)]


def test_the_gate_refuses_weak_evidence_even_when_the_words_match() -> None:
    # Strength -5 + 1.0 * -2 = -7; the words (0.8 of the question) add 4.8: -2.2 < 1.
    chosen = select(QUERY, [scored(0, 0, -2.0), scored(1, 0, -3.0)], TEXTS, [-5.0, -5.0, -5.0], RULES)
    assert not chosen.answered and chosen.answer == [] and chosen.facts == []
    assert chosen.question_coverage == 0.8
    assert chosen.evidence_score is not None and round(chosen.evidence_score, 3) == -2.2


def test_the_gate_weighs_the_words_of_the_question_found_in_the_passages() -> None:
    # The same scores: a question whose words the passages hold is answered, one about
    # something else is not (the model is confident about both).
    evidence, passages = [scored(0, 0, 1.5)], [-1.0, 0.0, 0.0]
    assert select(QUERY, evidence, TEXTS, passages, RULES).answered
    off_topic = select("How do I bake sourdough bread at home?", evidence, TEXTS, passages, RULES)
    assert not off_topic.answered
    assert off_topic.question_coverage == 0.0


def test_the_gate_counts_words_the_collection_lacks_against_answering() -> None:
    # A near miss: the passages hold 3 of the 5 content words ("reduce" and "quic" are not
    # there) and the model is confident: strength 1.5 + 6 x 0.6 = 5.1 passes a gate at 5, but
    # "quic" is in no document of the collection: 5.1 - 8 x 0.2 = 3.5 does not.
    near = "Does vitamin D supplementation reduce QUIC fractures?"
    evidence, passages = [scored(0, 0, 1.5)], [0.0, 0.0, 0.0]
    strict = dataclasses.replace(RULES, gate_min_score=5.0)
    unknown = select(near, evidence, TEXTS, passages, strict, ["quic"])
    assert unknown.unknown_share == 0.2 and round(unknown.evidence_score or 0, 3) == 3.5
    assert not unknown.answered
    # The same question and scores with no unknown word (or the weight off) are answered.
    assert select(near, evidence, TEXTS, passages, strict).answered
    unweighted = dataclasses.replace(strict, gate_unknown_weight=0)
    assert select(near, evidence, TEXTS, passages, unweighted, ["quic"]).answered
    # Only the question's own content words count: a stray or stopword term changes nothing.
    assert select(near, evidence, TEXTS, passages, strict, ["kafka", "the"]).unknown_share == 0.0


def test_the_gate_counts_a_word_that_is_no_misspelling_twice() -> None:
    # "quic" is unknown (8 x 0.2 off: 5.1 - 1.6 = 3.5 passes a gate at 3); unless no indexed
    # word is one edit from it either, which takes 10 x 0.2 more: 1.5 fails.
    near = "Does vitamin D supplementation reduce QUIC fractures?"
    evidence, passages = [scored(0, 0, 1.5)], [0.0, 0.0, 0.0]
    rules = dataclasses.replace(RULES, gate_min_score=3.0, gate_novel_weight=10.0)
    typo = select(near, evidence, TEXTS, passages, rules, ["quic"])
    assert typo.answered and typo.novel_share == 0.0
    novel = select(near, evidence, TEXTS, passages, rules, ["quic"], novel_terms=["quic"])
    assert not novel.answered and novel.novel_share == 0.2 and round(novel.evidence_score or 0, 3) == 1.5
    assert select(
        near,
        evidence,
        TEXTS,
        passages,
        dataclasses.replace(rules, gate_novel_weight=0),
        ["quic"],
        novel_terms=["quic"],
    ).answered


def test_an_unknown_word_costs_its_penalty_once_whatever_its_share() -> None:
    # A near miss names one missing subject among many words the passages hold: its share (1 in
    # 8) takes little; the penalty takes the same from it as from a two-word question.
    # Strength 1.5 + 6 x 5/8 words held = 5.25 passes a gate at 0; less the penalty, -0.75 fails.
    long_near = "Does vitamin D supplementation reduce hip fractures in elderly Datadog users?"
    evidence, passages = [scored(0, 0, 1.5)], [0.0, 0.0, 0.0]
    rules = dataclasses.replace(RULES, gate_min_score=0.0, gate_unknown_weight=0.0, gate_unknown_penalty=6.0)
    kept = select(long_near, evidence, TEXTS, passages, rules)
    refused = select(long_near, evidence, TEXTS, passages, rules, ["datadog"])
    assert kept.answered and not refused.answered
    assert round((kept.evidence_score or 0) - (refused.evidence_score or 0), 3) == 6.0
    # Two unknown words cost it once, not twice; a term that is none of the question's words, never.
    assert select(long_near, evidence, TEXTS, passages, rules, ["datadog", "users"]).evidence_score == (
        refused.evidence_score
    )
    assert select(long_near, evidence, TEXTS, passages, rules, ["the", "kafka"]).answered
    # Words not looked up (the BM25 leg did not answer): the penalty applies to every question.
    assert not select(long_near, evidence, TEXTS, passages, rules, words_checked=False).answered


def test_the_gate_refuses_a_question_no_passage_is_near_however_well_a_sentence_scores() -> None:
    # The cross-encoder is confident (strength 3 + 6 x 0.8 words) but the collection's nearest
    # passage is at cosine 0.25: the question is not about these documents.
    strong, passages = [scored(0, 0, 3.0)], [0.0, 0.0, 0.0]
    floored = dataclasses.replace(RULES, gate_min_similarity=0.4)
    far = select(QUERY, strong, TEXTS, passages, floored, similarity=0.25)
    assert not far.answered and far.off_topic and far.answer == [] and far.similarity == 0.25
    # At the floor, with the dense leg's cosine unknown, or with the floor off: the gate as before.
    assert select(QUERY, strong, TEXTS, passages, floored, similarity=0.4).answered
    unknown = select(QUERY, strong, TEXTS, passages, floored, similarity=None)
    assert unknown.answered and not unknown.off_topic
    assert select(QUERY, strong, TEXTS, passages, RULES, similarity=-0.5).answered
    # Off topic is said even when no sentence was scored (the judge skips them).
    assert select(QUERY, [], TEXTS, passages, floored, similarity=0.25).off_topic


def test_the_topicality_floor_holds_only_for_the_models_it_was_calibrated_for() -> None:
    floor = TopicalityFloor.parse(0.4, " minilm , other-model")
    assert floor.models == {"minilm", "other-model"}
    assert floor.refuses(0.25, "minilm") and not floor.refuses(0.4, "minilm")
    # Another model's cosines, or none at all: nothing is known, nothing refused.
    assert not floor.refuses(0.25, "e5") and floor.similarity(0.25, "e5") is None
    assert not floor.refuses(None, "minilm")
    assert TopicalityFloor.parse(0.4, "*").refuses(0.25, "e5")
    assert not TopicalityFloor.parse(-1.0, "*").refuses(-0.5, "e5")


def test_candidates_keep_the_sentences_closest_to_the_question_when_over_the_pair_bound() -> None:
    found = candidates(
        QUERY, [("Vitamin D trial", TEXTS[0]), ("", TEXTS[1])], max_passages=2, max_sentences=10, max_pairs=2
    )
    assert [c.text for c in found] == [
        "Supplementation with vitamin D reduced hip fractures.",
        "The reduction held for hip fractures in women.",
    ]
    # The title line is not a candidate.
    everything = candidates(
        QUERY, [("Vitamin D trial", TEXTS[0])], max_passages=1, max_sentences=10, max_pairs=99
    )
    assert "Vitamin D trial." not in [c.text for c in everything]
    # Two passages of three evidence sentences ("Vitamin D trial." is a label, not a sentence).
    assert len(candidates(QUERY, [("", TEXTS[0])] * 5, max_passages=2, max_sentences=10, max_pairs=99)) == 6


def test_support_candidates_score_the_cited_passage_first_and_respect_the_bound() -> None:
    rules = SupportRules(min_score=0.0, min_coverage=0.25, max_pairs=2)
    found = support_candidates("Hip fractures are common in the elderly [2].", TEXTS, rules, preferred=[1])
    assert found[0] == Candidate(1, 1, "Hip fractures are common in the elderly.")
    assert len(found) == 2


def test_a_passage_sentence_sharing_too_few_words_is_not_scored_for_support() -> None:
    # "Supplementation of vitamin D is common." scores near a real support with the
    # cross-encoder, but holds 2 of the claim's 5 content words.
    rules = SupportRules(min_score=0.0, min_coverage=0.5, max_pairs=16)
    passages = [
        "Supplementation of vitamin D is common.",
        "Vitamin D supplementation reduced the risk of fractures.",
    ]
    found = support_candidates(
        "Vitamin D supplementation reduces the risk of fractures [1].", passages, rules
    )
    assert [c.passage for c in found] == [1]


def test_a_sentence_keeps_the_citations_that_support_it_is_rebound_or_dropped() -> None:
    # Cited 1 and 2; only 2 supports it.
    assert bound_sources([1, 2], {0: -1.0, 1: 2.0}, 0.5) == ([2], 2.0)
    # Cited 1, which does not; passage 3 does: rebound.
    assert bound_sources([1], {0: -1.0, 2: 1.5}, 0.5) == ([3], 1.5)
    # Nothing supports it: dropped.
    assert bound_sources([1], {0: -1.0, 1: 0.1}, 0.5) == ([], 0.1)


def test_a_quote_is_recognised_whatever_its_marker_and_stop() -> None:
    assert quoted("Supplementation with vitamin D reduced hip fractures [1].", [TEXTS[0]])
    assert quoted("supplementation with  vitamin D reduced hip fractures", [TEXTS[0]])
    assert not quoted("Vitamin D supplementation reduces the risk of fractures [1].", [TEXTS[0]])
