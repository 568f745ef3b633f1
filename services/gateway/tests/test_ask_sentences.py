"""Ask with the cross-encoder judging sentences (real gateway, fake stages; the fake reranker's
sentence scores are set per test): extractive answers from the judged sentences, the evidence
gate, support checks that rebind or drop the narrator's sentences and the extractor's facts,
and the lexical path with a degradation when the judge is down."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ragmesh.extractor.v1 import extractor_pb2
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh.narrator.v1 import narrator_pb2
from services.gateway.answer.gate import GATE_REASON, OFF_TOPIC_REASON
from services.gateway.tests.conftest import COLLECTION, NAME_OF, Gateway, running_gateway

QUERY = "what is ZX-81?"
TEXTS = {
    "c3": "Vitamin D reduced hip fractures in a trial. Compliance was high.",
    "c1": "Hip fractures fell with calcium. The answer is here in full.",
}
# The fake narrator's sentence, as the support check reads it (citation taken off).
NARRATED = "The answer is here."


def ask(mode: int = gateway_pb2.ANSWER_MODE_EXTRACTIVE) -> gateway_pb2.AskRequest:
    return gateway_pb2.AskRequest(collection=COLLECTION, query=QUERY, mode=mode, include_facts=True)  # type: ignore[arg-type]


@asynccontextmanager
async def judged(scores: dict[str | tuple[str, str], float], **settings: object) -> AsyncIterator[Gateway]:
    """A reranking gateway whose judge scores every pair -3 but those in ``scores``."""
    async with running_gateway(gateway_rerank=True, **settings) as gateway:
        gateway.fakes.chunk_texts = dict(TEXTS)
        gateway.fakes.default_sentence_score = -3.0
        gateway.fakes.sentence_scores = scores
        yield gateway


GOOD_EVIDENCE: dict[str | tuple[str, str], float] = {
    (QUERY, "Vitamin D reduced hip fractures in a trial."): 3.0,
    (QUERY, "Compliance was high."): 2.5,
    (QUERY, "Hip fractures fell with calcium."): 1.0,
}


async def test_an_extractive_answer_states_the_judged_sentences_of_few_strong_passages() -> None:
    async with judged(GOOD_EVIDENCE) as gateway:
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert response.answered and not response.degradations
    # Both strong sentences of the best passage, in its order; c1 is 2 behind the best: not cited.
    assert response.answer == "Vitamin D reduced hip fractures in a trial [1]. Compliance was high [1]."
    assert [NAME_OF[c.chunk_id] for c in response.citations] == ["c3"]
    assert all(s.support_check == narrator_pb2.SUPPORT_CHECK_QUOTED for s in response.sentences)
    # The facts are the sentences at or over the fact floor (default -5), best first, with their
    # log-odds: the weak one too, last.
    assert [(f.text, f.score) for f in response.facts] == [
        ("Vitamin D reduced hip fractures in a trial.", 3.0),
        ("Compliance was high.", 2.5),
        ("Hip fractures fell with calcium.", 1.0),
        ("The answer is here in full.", -3.0),
    ]
    assert gateway.fakes.calls["extractor"] == 0
    narrate = gateway.fakes.requests["narrator"][0]
    assert [(f.text, f.source) for f in narrate.facts] == [
        ("Vitamin D reduced hip fractures in a trial.", 1),
        ("Compliance was high.", 1),
    ]


async def test_the_gate_says_the_documents_do_not_say_when_no_sentence_answers() -> None:
    # The best passage: reranker 3.0, best sentence -3: strength 1.5, under the gate's 2.0.
    async with judged({}, gateway_ask_gate_min_score=2.0) as gateway:
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert not response.answered and not response.citations and not response.sentences
    assert GATE_REASON in response.answer
    assert gateway.fakes.calls["extractor"] == 0 and gateway.fakes.calls["narrator"] == 0
    # The passages explored are still listed: the caller sees what was read.
    assert response.sources


async def test_words_no_document_holds_count_against_answering_and_are_named() -> None:
    # Strong evidence (best passage 3.0 + 0.5 x 3.0) passes the gate alone; "zx-81" being in no
    # document of the collection (the whole question's one content word) takes 10 off.
    async with judged(
        GOOD_EVIDENCE, gateway_ask_gate_min_score=2.0, gateway_ask_gate_unknown_weight=10.0
    ) as gateway:
        answered = await gateway.stub.Ask(ask(), timeout=10)
        gateway.fakes.unknown_terms = ["zx-81"]
        refused = await gateway.stub.Ask(ask(), timeout=10)
        searched = await gateway.stub.Search(
            gateway_pb2.SearchRequest(collection=COLLECTION, query=QUERY), timeout=10
        )
    assert answered.answered and list(answered.unknown_terms) == []
    assert not refused.answered and not refused.citations and list(refused.unknown_terms) == ["zx-81"]
    assert GATE_REASON in refused.answer and 'no document mentions "zx-81"' in refused.answer
    assert list(searched.unknown_terms) == ["zx-81"]


async def test_a_word_that_is_no_misspelling_of_any_indexed_word_counts_once_more() -> None:
    # Strong evidence (3.0 + 0.5 x 3.0 = 4.5) minus 2 for the unknown word still passes a gate
    # at 2; sparse finding no indexed word one edit from it takes 3 more.
    async with judged(
        GOOD_EVIDENCE,
        gateway_ask_gate_min_score=2.0,
        gateway_ask_gate_unknown_weight=2.0,
        gateway_ask_gate_novel_weight=3.0,
    ) as gateway:
        gateway.fakes.unknown_terms = ["zx-81"]
        misspelt = await gateway.stub.Ask(ask(), timeout=10)
        gateway.fakes.novel_terms = ["zx-81"]
        novel = await gateway.stub.Ask(ask(), timeout=10)
        searched = await gateway.stub.Search(
            gateway_pb2.SearchRequest(collection=COLLECTION, query=QUERY), timeout=10
        )
    assert misspelt.answered and list(misspelt.novel_terms) == []
    assert not novel.answered and list(novel.novel_terms) == ["zx-81"]
    assert list(searched.novel_terms) == ["zx-81"]


async def test_the_unknown_word_penalty_is_a_higher_gate_for_questions_holding_one() -> None:
    # Evidence 4.5 passes a gate at 2; the unknown word's share weighs nothing here, its penalty
    # (3) still takes 4.5 under the gate; the same question with every word known is answered.
    async with judged(
        GOOD_EVIDENCE,
        gateway_ask_gate_min_score=2.0,
        gateway_ask_gate_unknown_weight=0.0,
        gateway_ask_gate_unknown_penalty=3.0,
    ) as gateway:
        known = await gateway.stub.Ask(ask(), timeout=10)
        gateway.fakes.unknown_terms = ["zx-81"]
        unknown = await gateway.stub.Ask(ask(), timeout=10)
    assert known.answered
    assert not unknown.answered and GATE_REASON in unknown.answer


async def test_with_the_bm25_leg_down_every_question_meets_the_raised_gate() -> None:
    # No word was looked up: a near miss cannot be told by its words, so the penalty applies
    # as if one were missing (4.5 - 3 under 2); the answer says which leg was missing.
    async with judged(
        GOOD_EVIDENCE, gateway_ask_gate_min_score=2.0, gateway_ask_gate_unknown_penalty=3.0
    ) as gateway:
        gateway.fakes.behaviour["bm25"] = "fail"
        unchecked = await gateway.stub.Ask(ask(), timeout=10)
        gateway.fakes.behaviour["bm25"] = "ok"
        checked = await gateway.stub.Ask(ask(), timeout=10)
    assert not unchecked.answered and GATE_REASON in unchecked.answer
    assert any(d.stage == gateway_pb2.STAGE_SPARSE for d in unchecked.degradations)
    assert checked.answered


async def test_a_question_no_passage_is_near_is_refused_as_off_topic_before_any_sentence_is_judged() -> None:
    # The fake dense leg's best cosine is 0.9 (c0): under a 0.95 floor, over a 0.85 one. The
    # floor holds for the models it was calibrated for: the fake embedder's is "fake".
    async with judged(
        GOOD_EVIDENCE, gateway_ask_gate_min_similarity=0.95, gateway_ask_gate_similarity_models="x, fake"
    ) as gateway:
        refused = await gateway.stub.Ask(ask(), timeout=10)
        judged_calls, reranked_calls = gateway.fakes.calls["judge"], gateway.fakes.calls["reranker"]
        # Without the dense leg nothing says how near the collection is: the floor is not applied.
        gateway.fakes.behaviour["index-0"] = gateway.fakes.behaviour["index-1"] = "fail"
        without_dense = await gateway.stub.Ask(ask(), timeout=10)
    assert not refused.answered and not refused.citations
    assert OFF_TOPIC_REASON in refused.answer and "0.900, under 0.95" in refused.answer
    assert judged_calls == 0 and gateway.fakes.calls["narrator"] == 0
    # Nor were its passages reranked: the refusal did not wait for the reranker.
    assert reranked_calls == 0 and not any(s.HasField("rerank_score") for s in refused.sources)
    # (Its good passages came from the dense leg: it is refused, but not as off topic.)
    assert OFF_TOPIC_REASON not in without_dense.answer and GATE_REASON in without_dense.answer
    async with judged(
        GOOD_EVIDENCE, gateway_ask_gate_min_similarity=0.85, gateway_ask_gate_similarity_models="fake"
    ) as gateway:
        answered = await gateway.stub.Ask(ask(), timeout=10)
    assert answered.answered and answered.citations
    assert any(s.HasField("rerank_score") for s in answered.sources)
    # A floor calibrated for another model says nothing of this one's cosines: not applied.
    async with judged(GOOD_EVIDENCE, gateway_ask_gate_min_similarity=0.95) as gateway:
        other_model = await gateway.stub.Ask(ask(), timeout=10)
    assert other_model.answered and OFF_TOPIC_REASON not in other_model.answer


async def test_a_judge_that_is_down_leaves_the_lexical_path_and_a_reranker_degradation() -> None:
    async with judged(GOOD_EVIDENCE) as gateway:
        gateway.fakes.behaviour["judge"] = "fail"
        response = await gateway.stub.Ask(ask(), timeout=10)
    assert response.answered
    assert gateway.fakes.calls["extractor"] == 1
    assert any(
        d.stage == gateway_pb2.STAGE_RERANKER and "lexically only" in d.message for d in response.degradations
    )


async def test_an_llm_sentence_its_citation_does_not_support_is_rebound_to_the_passage_that_does() -> None:
    scores = {**GOOD_EVIDENCE, (NARRATED, "The answer is here in full."): 2.0}
    # (Passage 2 is not among the strongest: the rule tested below is off here.)
    async with judged(scores, gateway_ask_llm_cite_strongest=False) as gateway:
        response = await gateway.stub.Ask(ask(gateway_pb2.ANSWER_MODE_LLM), timeout=10)
    assert response.mode == gateway_pb2.ANSWER_MODE_LLM
    assert response.answer == "The answer is here [2]."
    (sentence,) = response.sentences
    assert list(sentence.sources) == [2]
    assert sentence.support_check == narrator_pb2.SUPPORT_CHECK_CROSS_ENCODER
    assert sentence.support_score == 2.0
    assert [(c.number, NAME_OF[c.chunk_id]) for c in response.citations] == [(2, "c1")]


async def test_an_llm_answer_that_cites_none_of_the_strongest_passages_gives_way_to_the_judged_one() -> None:
    # The same supported sentence, bound to passage 2 only; the judged extractive answer cites
    # passage 1 (its sentences score 3.0 and 2.5 against 1.0): the extractive answer stands.
    scores = {**GOOD_EVIDENCE, (NARRATED, "The answer is here in full."): 2.0}
    async with judged(scores) as gateway:
        response = await gateway.stub.Ask(ask(gateway_pb2.ANSWER_MODE_LLM), timeout=10)
    assert response.answer == "Vitamin D reduced hip fractures in a trial [1]. Compliance was high [1]."
    # Two sentences of one passage: the passage is listed once.
    assert [(c.number, NAME_OF[c.chunk_id]) for c in response.citations] == [(1, "c3")]
    assert response.mode == gateway_pb2.ANSWER_MODE_EXTRACTIVE
    assert any(
        (d.stage, d.reason) == (gateway_pb2.STAGE_NARRATOR, gateway_pb2.DEGRADATION_REASON_INVALID_OUTPUT)
        and "strongest" in d.message
        for d in response.degradations
    )


async def test_unsupported_llm_facts_and_sentences_are_dropped_and_the_judged_answer_stands() -> None:
    async with judged(GOOD_EVIDENCE) as gateway:
        response = await gateway.stub.Ask(ask(gateway_pb2.ANSWER_MODE_LLM), timeout=10)
    # The fake extractor's facts ("Fact from c3.") are in no passage and judged -3: dropped, so
    # the narrator got the judged sentences instead.
    narrate = gateway.fakes.requests["narrator"][0]
    assert "Fact from c3." not in [f.text for f in narrate.facts]
    assert all(f.origin == extractor_pb2.FACT_ORIGIN_EXTRACTIVE for f in response.facts)
    # Its sentence is supported by nothing read: dropped, and the judged extractive answer stands.
    assert "The answer is here" not in response.answer
    assert response.answer == "Vitamin D reduced hip fractures in a trial [1]. Compliance was high [1]."
    # The sentences that replace it are quotes of the passage they cite, and say so.
    assert [s.support_check for s in response.sentences] == [narrator_pb2.SUPPORT_CHECK_QUOTED] * 2
    assert response.mode == gateway_pb2.ANSWER_MODE_EXTRACTIVE
    assert (gateway_pb2.STAGE_NARRATOR, gateway_pb2.DEGRADATION_REASON_INVALID_OUTPUT) in {
        (d.stage, d.reason) for d in response.degradations
    }


async def test_an_llm_ask_whose_narrator_is_down_states_the_judged_sentences() -> None:
    async with judged(GOOD_EVIDENCE) as gateway:
        gateway.fakes.behaviour["narrator"] = "fail"
        response = await gateway.stub.Ask(ask(gateway_pb2.ANSWER_MODE_LLM), timeout=10)
    # Not the best facts of distinct passages: the passages the judge found strongest.
    assert response.answer == "Vitamin D reduced hip fractures in a trial [1]. Compliance was high [1]."
    assert [(c.number, NAME_OF[c.chunk_id]) for c in response.citations] == [(1, "c3")]
    assert response.mode == gateway_pb2.ANSWER_MODE_EXTRACTIVE
    assert gateway_pb2.STAGE_NARRATOR in {d.stage for d in response.degradations}
