from __future__ import annotations

import json
from typing import Any

from meshkit.llm.factory import LLMError
from services.extractor import facts as F
from services.extractor.facts import Job, Source, resolve_scores
from services.extractor.pipeline import Extractor
from services.extractor.tests.conftest import Call, FakeEmbed, FakeLLM, echo_map, make_settings

QUERY = "When was the Eiffel Tower built?"


def sources(
    texts: list[str], *, docs: list[str] | None = None, scores: list[float] | None = None
) -> list[Source]:
    resolved = resolve_scores(scores if scores is not None else [None] * len(texts))
    return [
        Source(i, f"p{i}", docs[i] if docs else f"d{i}", f"Title {i}", text, resolved[i])
        for i, text in enumerate(texts)
    ]


def job(srcs: list[Source], **overrides: Any) -> Job:
    base: dict[str, Any] = {
        "query": QUERY,
        "sources": srcs,
        "mode": "llm",
        "max_facts": 100,
        "batch_size": 10,
        "budget_tokens": 100_000,
    }
    return Job(**{**base, **overrides})


def numbered_texts(n: int) -> list[str]:
    return [f"Passage number {i} says the tower had {i} visitors in year {1900 + i}." for i in range(n)]


async def run(
    llm: FakeLLM, srcs: list[Source], embed: FakeEmbed | None = None, settings: Any = None, **kw: Any
):
    extractor = Extractor(settings or make_settings(), llm, embed or FakeEmbed())
    return await extractor.extract(job(srcs, **kw))


# --- map step ---


async def test_25_passages_make_batches_of_10_10_5_within_the_concurrency() -> None:
    llm = FakeLLM(delay_s=0.02)
    settings = make_settings(extractor_llm_concurrency=2)
    outcome = await run(llm, sources(numbered_texts(25)), settings=settings)
    maps = llm.by_purpose("map")
    assert sorted(len(c.numbered()) for c in maps) == [5, 10, 10]
    # The schema bounds each reply to the batch: maxItems and the passage numbers.
    assert sorted(c.max_items for c in maps) == [5, 10, 10]
    assert llm.max_in_flight == 2
    assert outcome.mode == "llm" and outcome.llm_calls == 3 and not outcome.degraded_reason
    assert len(outcome.facts) == 25
    assert {f.origin for f in outcome.facts} == {F.LLM}
    # Best first: with no scores, earlier passages rank higher.
    assert [f.source.index for f in outcome.facts] == list(range(25))


async def test_prompt_numbers_passages_and_cuts_them() -> None:
    llm = FakeLLM()
    long_text = "word " * 2000
    settings = make_settings(extractor_passage_chars_in_prompt=300)
    await run(llm, sources([long_text, "Short passage."]), settings=settings)
    (call,) = llm.calls
    lines = call.numbered()
    assert set(lines) == {1, 2}
    assert lines[1].startswith("(Title 0) ") and len(lines[1]) < 330
    assert "at most one fact per title" in call.prompt
    assert call.max_tokens == settings.extractor_max_tokens


async def test_malformed_entry_is_skipped_and_its_passage_falls_back_to_a_snippet() -> None:
    def script(call: Call) -> str:
        return json.dumps(
            {
                "facts": [
                    {"passage": 1, "fact": "Fact one."},
                    {"passage": 2, "fact": 42},  # not a string: malformed
                    {"passage": 3, "fact": "Fact three."},
                    "garbage",
                ]
            }
        )

    texts = ["One is here.", "The Eiffel Tower was built in 1889. Other things.", "Three is here."]
    outcome = await run(FakeLLM(script), sources(texts))
    by_passage = {f.source.index: f for f in outcome.facts}
    assert by_passage[0].text == "Fact one." and by_passage[0].origin == F.LLM
    assert by_passage[2].text == "Fact three." and by_passage[2].origin == F.LLM
    assert by_passage[1].origin == F.SNIPPET
    assert by_passage[1].text.startswith("The Eiffel Tower was built in 1889.")
    kinds = [i.kind for i in outcome.issues]
    assert kinds == [F.MALFORMED_ENTRY, F.MALFORMED_ENTRY]
    assert outcome.mode == "llm" and not outcome.degraded_reason


async def test_bare_list_reply_is_accepted() -> None:
    reply = '[{"passage": "1", "fact": "Built 1887-1889."}]'
    outcome = await run(FakeLLM(lambda c: reply), sources(["It was built 1887-1889."]))
    assert [(f.text, f.origin) for f in outcome.facts] == [("Built 1887-1889.", F.LLM)]


async def test_a_fact_is_moved_to_the_passage_that_holds_it_or_dropped() -> None:
    def script(call: Call) -> str:
        facts = [
            {"passage": 1, "fact": "The tower had 2 visitors in 1902."},
            {"passage": 3, "fact": "Bananas are yellow and curved."},
        ]
        return json.dumps({"facts": facts})

    texts = ["Nothing here.", "The tower had 2 visitors in year 1902.", "Also nothing."]
    outcome = await run(FakeLLM(script), sources(texts))
    llm_facts = [(f.text, f.source.index) for f in outcome.facts if f.origin == F.LLM]
    assert llm_facts == [("The tower had 2 visitors in 1902.", 1)]
    assert [i.kind for i in outcome.issues] == [F.REATTRIBUTED, F.UNGROUNDED]


async def test_a_fact_that_only_restates_a_title_is_dropped() -> None:
    def script(call: Call) -> str:
        facts = [
            {"passage": 1, "fact": "Title 0."},
            {"passage": 2, "fact": "The tower had 2 visitors in 1902."},
        ]
        return json.dumps({"facts": facts})

    outcome = await run(
        FakeLLM(script), sources(["Title 0. Nothing else.", "The tower had 2 visitors in 1902."])
    )
    llm_facts = [(f.text, f.source.index) for f in outcome.facts if f.origin == F.LLM]
    assert llm_facts == [("The tower had 2 visitors in 1902.", 1)]
    assert [i.kind for i in outcome.issues] == [F.TITLE_ONLY]


async def test_unknown_passage_and_second_fact_for_a_passage_are_dropped() -> None:
    def script(call: Call) -> str:
        return json.dumps(
            {
                "facts": [
                    {"passage": 1, "fact": "First fact of one."},
                    {"passage": 1, "fact": "Second fact of one."},
                    {"passage": 9, "fact": "Cites nothing."},
                ]
            }
        )

    outcome = await run(FakeLLM(script), sources(["First fact of one.", "Two."]))
    assert [f.text for f in outcome.facts] == ["First fact of one."]
    assert [i.kind for i in outcome.issues] == [F.UNKNOWN_PASSAGE]


async def test_non_json_reply_fails_only_its_batch_which_answers_extractively() -> None:
    def script(call: Call) -> str:
        if "Passage number 0" in call.prompt:
            return "I am sorry, I cannot help with that."
        return echo_map(call)

    outcome = await run(FakeLLM(script), sources(numbered_texts(4)), batch_size=2)
    assert [(i.batch, i.kind) for i in outcome.issues] == [(0, F.BATCH_FAILED)]
    origins = {f.source.index: f.origin for f in outcome.facts}
    assert origins == {0: F.EXTRACTIVE, 1: F.EXTRACTIVE, 2: F.LLM, 3: F.LLM}
    assert outcome.mode == "llm"
    assert outcome.degraded_reason.startswith("invalid_output: 1 of 2 batches")


async def test_llm_unavailable_degrades_to_extractive_and_stops_calling() -> None:
    llm = FakeLLM(lambda c: LLMError("unavailable", "connection refused"))
    outcome = await run(
        llm, sources(numbered_texts(25)), settings=make_settings(extractor_relevance_gate=True)
    )
    assert len(llm.calls) == 1 and outcome.llm_calls == 1
    assert outcome.mode == "extractive"
    assert outcome.degraded_reason == "unavailable: llm connection refused"
    assert {f.origin for f in outcome.facts} == {F.EXTRACTIVE}
    assert {f.source.index for f in outcome.facts} == set(range(25))
    assert [i.kind for i in outcome.issues] == [F.BATCH_FAILED]


async def test_slow_llm_hits_the_deadline_and_the_rest_is_extractive() -> None:
    llm = FakeLLM(delay_s=10.0)
    settings = make_settings(llm_timeout_s=0.2)
    outcome = await run(llm, sources(numbered_texts(3)), settings=settings, batch_size=1)
    assert len(llm.calls) == 1
    assert outcome.degraded_reason.startswith("deadline: ")
    assert outcome.mode == "extractive" and len(outcome.facts) == 3


# --- relevance gate ---


async def test_gate_with_one_pass_out_of_five_keeps_the_best_four() -> None:
    def script(call: Call) -> str:
        if call.purpose == "gate":
            return json.dumps({"relevant": [5]})
        return echo_map(call)

    llm = FakeLLM(script)
    outcome = await run(
        llm, sources(numbered_texts(5)), settings=make_settings(extractor_relevance_gate=True)
    )
    assert [f.source.index for f in outcome.facts] == [0, 1, 2, 4]
    assert outcome.gated_out == 1 and outcome.llm_calls == 2
    (gate_call,) = llm.by_purpose("gate")
    assert gate_call.max_items == 5


async def test_gate_with_no_pass_keeps_all_and_otherwise_keeps_the_passes() -> None:
    for relevant, expected in (([], [0, 1, 2, 3, 4]), ([2, 4, "x", 99], [1, 3])):

        def script(call: Call, relevant: list[Any] = relevant) -> str:
            return json.dumps({"relevant": relevant}) if call.purpose == "gate" else echo_map(call)

        settings = make_settings(extractor_relevance_gate=True)
        outcome = await run(FakeLLM(script), sources(numbered_texts(5)), settings=settings)
        assert [f.source.index for f in outcome.facts] == expected
        assert outcome.gated_out == 5 - len(expected)


async def test_gate_failure_keeps_all_with_an_issue() -> None:
    def script(call: Call) -> str | Exception:
        return LLMError("invalid_output", "nonsense") if call.purpose == "gate" else echo_map(call)

    settings = make_settings(extractor_relevance_gate=True)
    outcome = await run(FakeLLM(script), sources(numbered_texts(4)), settings=settings)
    assert len(outcome.facts) == 4 and outcome.gated_out == 0
    assert [i.kind for i in outcome.issues] == [F.GATE_FAILED]


# --- dedup and cap ---


async def test_dedup_keeps_the_best_fact_per_document_and_merges_duplicates() -> None:
    texts = ["Alpha fact here.", "Beta fact here.", "Gamma fact here.", "gamma FACT here!"]
    outcome = await run(FakeLLM(), sources(texts, docs=["a", "a", "b", "c"], scores=[1.0, 5.0, 3.0, 2.0]))
    assert [(f.source.id, f.score) for f in outcome.facts] == [("p1", 5.0), ("p2", 3.0)]


async def test_max_facts_caps_the_result() -> None:
    outcome = await run(FakeLLM(), sources(numbered_texts(8)), max_facts=3)
    assert [f.source.index for f in outcome.facts] == [0, 1, 2]


# --- context budget ---


def long_fact(i: int) -> str:
    return f"Passage {i} explains at great length " + "and in many words " * 10 + f"that the answer is {i}."


async def test_budget_summarises_until_the_facts_fit() -> None:
    def script(call: Call) -> str:
        if call.purpose == "map":
            return json.dumps({"facts": [{"passage": n, "fact": long_fact(n)} for n in call.numbered()]})
        return json.dumps({"facts": [{"passage": n, "fact": f"Answer {n}."} for n in call.numbered()]})

    llm = FakeLLM(script)
    outcome = await run(llm, sources([long_fact(n) for n in range(1, 5)]), budget_tokens=60)
    assert outcome.summary_rounds == 1
    assert len(llm.by_purpose("summary")) == 1
    assert [f.origin for f in outcome.facts] == [F.SUMMARY] * 4
    assert [f.source.index for f in outcome.facts] == [0, 1, 2, 3]
    assert sum((len(f.text) + 3) // 4 for f in outcome.facts) <= 60


async def test_summary_that_does_not_shorten_keeps_the_facts_and_then_drops_to_fit() -> None:
    def script(call: Call) -> str:
        if call.purpose == "map":
            return json.dumps({"facts": [{"passage": n, "fact": long_fact(n)} for n in call.numbered()]})
        return json.dumps(
            {"facts": [{"passage": 1, "fact": long_fact(1) + " And more."}, {"passage": 8, "fact": "x"}]}
        )

    llm = FakeLLM(script)
    outcome = await run(llm, sources([long_fact(n) for n in range(1, 5)]), budget_tokens=120)
    # No progress ends the rounds; the lowest-scored facts go.
    assert outcome.summary_rounds == 1
    assert [f.source.index for f in outcome.facts] == [0, 1]
    assert {f.origin for f in outcome.facts} == {F.LLM}
    assert F.UNKNOWN_PASSAGE in [i.kind for i in outcome.issues]


async def test_budget_without_llm_drops_the_lowest_scored() -> None:
    llm = FakeLLM(lambda c: LLMError("breaker_open", "circuit breaker open"))
    texts = [long_fact(i) for i in range(4)]
    outcome = await run(llm, sources(texts), budget_tokens=80)
    assert outcome.summary_rounds == 0 and outcome.llm_calls == 1
    assert outcome.degraded_reason.startswith("breaker_open: ")
    assert sum((len(f.text) + 3) // 4 for f in outcome.facts) <= 80
    assert outcome.facts and outcome.facts[0].source.index == 0


async def test_a_single_fact_over_the_budget_is_cut_to_it() -> None:
    outcome = await run(FakeLLM(), sources([long_fact(0)]), mode="extractive", budget_tokens=5)
    assert len(outcome.facts) == 1 and len(outcome.facts[0].text) <= 20


# --- extractive mode ---


async def test_extractive_orders_sentences_by_similarity_within_passage_rank() -> None:
    texts = [
        "Paris has many bridges. The Eiffel Tower was built between 1887 and 1889. Croissants are tasty.",
        "The Eiffel Tower was built by Gustave Eiffel. It is made of iron.",
    ]
    embed = FakeEmbed()
    outcome = await run(FakeLLM(), sources(texts, scores=[4.0, 1.0]), embed=embed, mode="extractive")
    assert [(f.source.index, f.text) for f in outcome.facts] == [
        (0, "The Eiffel Tower was built between 1887 and 1889."),
        (0, "Paris has many bridges."),
        (1, "The Eiffel Tower was built by Gustave Eiffel."),
        (1, "It is made of iron."),
    ]
    assert outcome.facts[0].score > outcome.facts[1].score
    assert {f.origin for f in outcome.facts} == {F.EXTRACTIVE}
    assert outcome.mode == "extractive" and outcome.llm_calls == 0 and not outcome.issues
    assert embed.calls and not outcome.degraded_reason


async def test_extractive_similarity_does_not_overturn_a_much_better_passage() -> None:
    texts = ["Unrelated words only here.", "The Eiffel Tower was built in 1889."]
    outcome = await run(FakeLLM(), sources(texts, docs=["a", "b"], scores=[10.0, 0.0]), mode="extractive")
    assert outcome.facts[0].source.index == 0


async def test_embedder_down_falls_back_to_lexical_scoring_with_an_issue() -> None:
    texts = ["Paris has many bridges. The Eiffel Tower was built in 1889. Croissants are tasty."]
    outcome = await run(FakeLLM(), sources(texts), embed=FakeEmbed(down=True), mode="extractive")
    assert outcome.facts[0].text == "The Eiffel Tower was built in 1889."
    assert len(outcome.facts) == 2
    assert [i.kind for i in outcome.issues] == [F.EMBEDDER_UNAVAILABLE]
    assert outcome.mode == "extractive"


async def test_extractive_keeps_sentences_of_one_passage_per_document() -> None:
    texts = ["Eiffel tower one. Eiffel tower two.", "Eiffel tower three. Eiffel tower four."]
    outcome = await run(FakeLLM(), sources(texts, docs=["a", "a"]), mode="extractive")
    # facts_per_source (1) passages' worth of sentences (2 each) per document.
    assert len(outcome.facts) == 2


async def test_no_fact_at_all_falls_back_to_the_passages_best_sentences() -> None:
    outcome = await run(FakeLLM(lambda c: '{"facts": []}'), sources(numbered_texts(3)))
    assert [f.origin for f in outcome.facts] == [F.EXTRACTIVE] * 3
    assert [i.kind for i in outcome.issues] == [F.NO_FACTS]
    assert outcome.mode == "llm" and outcome.llm_calls == 1
