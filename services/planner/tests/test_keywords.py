from __future__ import annotations

import pytest

from services.planner.keywords import MAX_KEYWORD_CHARS, extract_keywords


def keywords(query: str, limit: int = 8) -> list[str]:
    return extract_keywords(query, limit)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("How does IL-6 affect p53?", ["IL-6", "p53"]),
        ("Where is H3K27me3 enriched?", ["H3K27me3"]),
        ("Is CVE-2024-1234 patched?", ["CVE-2024-1234"]),
        ("Why do I get ERR_CONN_RESET?", ["ERR_CONN_RESET"]),
        ("Crash at address 0x7f3a in the loader", ["0x7f3a"]),
        ("What does getMarkdownFiles return?", ["getMarkdownFiles"]),
        ("Where is max_batch_size set?", ["max_batch_size"]),
        ("What does os.path.join do with absolute parts?", ["os.path.join"]),
        ("What changed in 2.11.3 and in v4?", ["2.11.3", "v4"]),
        ("The server returned error 404 for the page", ["404"]),
        ("The container died with exit code 137", ["137"]),
        ("Rust error E0425 in the parser", ["E0425"]),
        ("Where is /etc/ragmesh/config.yaml read?", ["/etc/ragmesh/config.yaml"]),
        ("Is PMID 12345678 retracted?", ["12345678", "PMID"]),
        ("Does COVID-19 damage the heart?", ["COVID-19"]),
    ],
)
def test_identifiers_and_codes(query: str, expected: list[str]) -> None:
    assert keywords(query) == expected


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("How is HIV detected in DNA samples?", ["HIV", "DNA"]),
        ("What did NASA say about it?", ["NASA"]),
        ("Is AT&T a carrier?", ["AT&T"]),
        ("Which APIs changed?", ["APIs"]),
    ],
)
def test_acronyms(query: str, expected: list[str]) -> None:
    assert keywords(query) == expected


def test_acronym_rule_skips_emphasis_roman_numerals_and_shouting() -> None:
    assert keywords("Is it NOT allowed to use ALL of them?") == []
    assert keywords("Does type II diabetes differ?") == []
    assert keywords("HOW DO I FIX THE WIFI") == []


def test_capitalised_names_not_at_sentence_start() -> None:
    assert keywords("What does Kubernetes do with pods?") == ["Kubernetes"]
    assert keywords("Researchers at Stanford University found it") == ["Stanford University"]
    # One capital at the start of a sentence is grammar; a two-word name there still counts.
    assert keywords("Aspirin reduces fever. Ibuprofen too.") == []
    assert keywords("West Nile virus spreads via mosquitoes") == ["West Nile"]


def test_names_split_at_punctuation_and_skip_calendar_words() -> None:
    assert keywords("Do Paris, London and Berlin differ in March?") == ["Paris", "London", "Berlin"]


def test_title_case_query_yields_no_names() -> None:
    assert keywords("How To Configure Reverse Proxies On Servers") == []


@pytest.mark.parametrize(
    "query",
    [
        "What is the role of the immune system?",
        "How do vaccines train the body to fight infections?",
        "Participating in six months of physical activity improves cognitive functioning.",
        "All hematopoietic stem cells segregate their chromosomes randomly.",
        "I think the 1990s had 3-year studies with 5mg doses and 2nd-line drugs, e.g. statins.",
        "0-dimensional biomaterials show inductive properties.",
        "Does mRNA or siRNA reach the cell?",
        "Don't the patients' doctors know?",
    ],
)
def test_plain_english_has_no_keywords(query: str) -> None:
    assert keywords(query) == []


@pytest.mark.parametrize(
    ("query", "phrase"),
    [
        ('Where is "connection reset by peer" logged?', "connection reset by peer"),
        ("Who wrote 'the quick brown fox'?", "the quick brown fox"),
        ("Who said \u201cto be or not to be\u201d first?", "to be or not to be"),
        ("What does `git rebase --onto` do?", "git rebase --onto"),
    ],
)
def test_quoted_phrases_are_kept_whole(query: str, phrase: str) -> None:
    found = keywords(query)
    assert found[0] == phrase
    # Nothing inside the quotes is split out into keywords of its own.
    assert all(k == phrase or k not in phrase for k in found)


def test_apostrophes_are_not_quotes() -> None:
    # Read as quotes they would make the phrase "s and Parkinson".
    assert keywords("Alzheimer's and Parkinson's patients don't respond") == ["Parkinson's"]


def test_quoted_phrases_come_first_then_identifiers_acronyms_names() -> None:
    query = 'Does Grafana show HTTP 503 from "upstream timed out" in nginx-1.25.3?'
    assert keywords(query) == ["upstream timed out", "503", "nginx-1.25.3", "HTTP", "Grafana"]


def test_deduplicated_case_insensitively_and_capped() -> None:
    assert keywords("p53 and P53 and p53") == ["p53"]
    many = " ".join(f"ID{i}" for i in range(20))
    assert keywords(many, limit=8) == [f"ID{i}" for i in range(8)]


def test_long_quoted_phrase_is_cut_at_a_word_boundary() -> None:
    phrase = " ".join(["word"] * 100)
    [found] = keywords(f'"{phrase}"')
    assert len(found) <= MAX_KEYWORD_CHARS
    assert phrase.startswith(found)
    assert found.endswith("word")
