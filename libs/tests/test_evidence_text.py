"""Evidence sentences (meshkit.text.evidence): prose from real documentation pages, tables as
whole rows with their header, no code, front matter, shortcodes or HTML; linear time on hostile
text."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshkit.text.evidence import evidence_sentences
from meshkit.text.front_matter import split_front_matter
from meshkit.text.markup import HUGO_SHORTCODES, inline_text, strip_html_comments, strip_tags

SHARED = Path(__file__).resolve().parents[3] / "shared"
GRPC_DOCS = SHARED / "corpora" / "grpc-docs" / "docs"
SCIFACT_RATIONALES = SHARED / "bench" / "scifact" / "rationales_train.jsonl"
MEGABYTE = 1_000_000
# The linear code needs a few seconds per megabyte of the worst shapes on a loaded 2-core
# machine; a quadratic step needs hours.
BOUND_S = 30.0

# --- real pages (excerpts of the gRPC documentation, CC BY 4.0) ------------------------------

KEEPALIVE_TOP = """---
title: Keepalive
description: >-
  How to use HTTP/2 PING-based keepalives in gRPC.
---

### Overview

HTTP/2 PING-based keepalives are a way to keep an HTTP/2 connection alive even when there is no
data being transferred. This is done by periodically sending a [PING frame] to the other end of
the connection.

[PING frame]: https://httpwg.org/specs/rfc7540.html#PING
"""

DEBUGGING_TABLE = """### Language examples

| Language | Example          | Notes                                                            |
|----------|------------------|------------------------------------------------------------------|
| C++      | [C++ Example]    |                                                                  |
| Go       | [Go Example]     | [Go test server implementing admin services from grpcdebug docs] |
| Java     | [Java Example]   |                                                                  |

### References
"""

JAVA_QUICKSTART_NOTE = """{{% alert title="Note" color="info" %}}
  gRPC Java does not support running a server and a client in the same process
  on some platforms without extra configuration.
{{% /alert %}}

Run the server:

```sh
$ ./build/install/examples/bin/hello-world-server
INFO: Server started, listening on 50051
```

    $ ./gradlew installDist
    BUILD SUCCESSFUL in 2s

The server is now listening on port 50051.
"""

FAQ_EXCERPT = """---
title: FAQ
---

### What is the latest gRPC Version?

The latest release tag is {{< param grpc_vers.core >}}.

### Why is gRPC better than any binary blob over HTTP/2?

This is largely what gRPC is on the wire. Examples of such features include:

* interaction with flow-control at the application layer
* cascading call-cancellation
* load balancing & failover

<!-- TODO(someone): Add example. -->
{{< youtube id="cSGBbwvW1y4" class="youtube-video" title="Getting started with gRPC" >}}
"""


def test_front_matter_goes_prose_stays() -> None:
    sentences = evidence_sentences(KEEPALIVE_TOP)
    assert sentences == [
        "HTTP/2 PING-based keepalives are a way to keep an HTTP/2 connection alive even when there is "
        "no data being transferred.",
        "This is done by periodically sending a PING frame to the other end of the connection.",
    ]


def test_table_rows_keep_their_header() -> None:
    assert evidence_sentences(DEBUGGING_TABLE) == [
        "Language: C++; Example: C++ Example.",
        "Language: Go; Example: Go Example; "
        "Notes: Go test server implementing admin services from grpcdebug docs.",
        "Language: Java; Example: Java Example.",
    ]


def test_shortcode_tags_go_their_prose_stays_code_goes() -> None:
    sentences = evidence_sentences(JAVA_QUICKSTART_NOTE)
    assert sentences == [
        "gRPC Java does not support running a server and a client in the same process on some platforms "
        "without extra configuration.",
        "The server is now listening on port 50051.",
    ]


def test_headings_questions_comments_and_embeds_are_not_evidence() -> None:
    sentences = evidence_sentences(FAQ_EXCERPT)
    assert sentences == [
        "The latest release tag is .",
        "This is largely what gRPC is on the wire.",
        "Examples of such features include:",
        "interaction with flow-control at the application layer",
        "cascading call-cancellation",
        "load balancing & failover",
    ]
    joined = " ".join(sentences)
    for markup in ("{{", "<!--", "youtube", "title:", "?", "###"):
        assert markup not in joined


def test_heading_attributes_go() -> None:
    text = (
        "## Sending data over long-lived connections with a proxy in between {#proxy}\n\n"
        "Send keepalive pings often."
    )
    assert evidence_sentences(text) == [
        "Sending data over long-lived connections with a proxy in between",
        "Send keepalive pings often.",
    ]


def test_chunk_heading_path_is_not_a_sentence() -> None:
    chunk = (
        "gRPC on Kubernetes > Setting up the load balancer with a headless service\n\nUse a headless service."
    )
    assert evidence_sentences(chunk) == ["Use a headless service."]


def test_jinja_and_gitbook_tags() -> None:
    text = (
        '{% hint style="info" %}\nTokens expire after one hour.\n{% endhint %}\n\n'
        "Hello {{ user.name }}, welcome back."
    )
    assert evidence_sentences(text) == ["Tokens expire after one hour.", "Hello , welcome back."]


def test_a_row_is_one_sentence_whatever_its_cells_say() -> None:
    text = (
        "| Option | Description | Default |\n|---|---|---|\n"
        "| `KEEPALIVE_TIMEOUT` | The timeout for a PING frame. If no ack comes, the connection closes. "
        "| 20 s |\n"
    )
    assert evidence_sentences(text) == [
        "Option: KEEPALIVE_TIMEOUT; Description: The timeout for a PING frame. If no ack comes, the "
        "connection closes.; Default: 20 s."
    ]


def test_rows_without_their_header_keep_their_values() -> None:
    # A chunk that starts inside the keepalive options table, then a row cut mid-cell.
    text = (
        "| `MAX_CONNECTION_IDLE` | Server | Maximum time that a channel may have no outstanding rpcs. "
        "| N/A | INT_MAX (Infinite) |\n"
        "| | |\n\n"
        "may be converted to this error. |\n\n"
        "Plain words make a sentence."
    )
    assert evidence_sentences(text) == [
        "MAX_CONNECTION_IDLE; Server; Maximum time that a channel may have no outstanding rpcs.; "
        "N/A; INT_MAX (Infinite).",
        "may be converted to this error.",
        "Plain words make a sentence.",
    ]


def test_unterminated_fence_hides_the_rest() -> None:
    text = "Install the package first.\n\n```python\nimport grpc\nchannel = grpc.insecure_channel('x')\n"
    assert evidence_sentences(text) == ["Install the package first."]


def test_code_fragment_cut_from_its_fence_is_not_prose() -> None:
    # A chunk that starts inside a fence opened in the previous chunk.
    text = "stub = route_guide_pb2_grpc.RouteGuideStub(channel); feature = stub.GetFeature(point)\n"
    assert evidence_sentences(text) == []


def test_chunk_that_starts_inside_a_fence() -> None:
    # The opening ```java line is in the previous chunk; this one starts with its code.
    text = (
        "Java > Basics > Client\n\n"
        "    // Send numPoints points randomly selected from the features list.\n"
        "    requestObserver.onNext(point);\n"
        "```\n\n"
        "Calling the streaming method returns a request observer.\n\n"
        "```java\nrequestObserver.onCompleted();\n```\n"
    )
    assert evidence_sentences(text) == ["Calling the streaming method returns a request observer."]


def test_bare_fences_in_pairs_are_not_mistaken_for_a_closer() -> None:
    text = "```\n$ make\n```\n\nThe build writes one binary per example.\n"
    assert evidence_sentences(text) == ["The build writes one binary per example."]


def test_row_cut_by_a_chunk_boundary_keeps_its_cells_apart() -> None:
    text = "(optional) | Histogram | s | The end-to-end time of an RPC attempt.\n"
    assert evidence_sentences(text) == ["(optional); Histogram; s; The end-to-end time of an RPC attempt."]


@pytest.mark.parametrize(
    "sentence",
    [
        # SciFact rationale sentences: statistics are full of brackets, comparisons and stars.
        "Relative to women who weighed 3.000-3.499 kg, the risk was 0.96 (CI 0.80-1.16) in those who "
        "weighed < 2.500 kg, and 1.12 (95% CI 1.00-1.25) in those who weighed > or = 4.000 kg.",
        "Women with high serum FSH values (>10 mIU/mL [n = 83]) did not have a different probability.",
        "The association is not restricted to carriers of HLA-B*27 but also found in HLA-B*40:01 carriers.",
        "Individuals homozygous for the null variant (*2*2) drink considerably less alcohol.",
    ],
)
def test_plain_text_evidence_is_kept_verbatim(sentence: str) -> None:
    assert evidence_sentences(sentence) == [sentence]


@pytest.mark.skipif(not SCIFACT_RATIONALES.is_file(), reason="SciFact is not checked out")
def test_scifact_rationale_sentences_survive() -> None:
    import json

    sentences = [
        text
        for line in SCIFACT_RATIONALES.read_text(encoding="utf-8").splitlines()
        for evidence in json.loads(line)["evidence"].values()
        for entry in evidence
        for text in entry["sentence_texts"]
    ]
    kept = sum(1 for s in sentences if evidence_sentences(s) == [" ".join(s.split())])
    assert kept >= 0.99 * len(sentences), (kept, len(sentences))


def test_strip_tags_keeps_an_unclosed_or_paragraph_crossing_opener() -> None:
    assert strip_tags("a {{< b\n\nc >}} d", HUGO_SHORTCODES) == "a {{< b\n\nc >}} d"
    assert strip_tags("a {{< b >}} c {{< d", HUGO_SHORTCODES) == "a  c {{< d"
    assert strip_tags("x {% raw %} y {{ z }}") == "x  y "


def test_front_matter_fields() -> None:
    front = split_front_matter('+++\ntitle = "Auth"\n+++\nBody\n')
    assert front is not None and front.field("title") == "Auth" and front.body == "Body\n"
    assert split_front_matter("---\nnot closed\n") is None
    assert split_front_matter("Body first\n---\n") is None


def test_html_comments() -> None:
    assert strip_html_comments("a <!-- b --> c <!-- d") == "a  c "


@pytest.mark.skipif(not GRPC_DOCS.is_dir(), reason="the grpc-docs corpus is not checked out")
def test_no_markup_survives_in_any_grpc_docs_page() -> None:
    pages = sorted(GRPC_DOCS.rglob("*.md"))
    assert len(pages) == 110
    total = 0
    for page in pages:
        sentences = evidence_sentences(page.read_text(encoding="utf-8"))
        total += len(sentences)
        for sentence in sentences:
            for markup in ("{{", "}}", "{%", "%}", "<!--", "```", "](", "|---"):
                assert markup not in sentence, (page, sentence)
            assert not sentence.startswith(("title:", "description:", "#", "* ", "- ", "|")), (page, sentence)
    assert total > 3000


# --- hostile text ------------------------------------------------------------------------------

MARKUP_CHARS = "|`{}<>%#*-_[]()!:\n \\~+=.?"
MARKUP_TOKENS = ["a", "B", "ab ", "{{<", ">}}", "```", "| --- |"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([*MARKUP_CHARS, "a", "B", "ab ", "{{<", ">}}", "```", "| --- |"]), max_size=150
    ).map("".join)
)
def test_any_markup_soup_gives_clean_sentences(text: str) -> None:
    for sentence in evidence_sentences(text):
        assert sentence == sentence.strip() and sentence
        assert "\n" not in sentence


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.text(max_size=200))
def test_strip_tags_removes_only_closed_tags(before: str, after: str) -> None:
    inner = "a-tag x"
    result = strip_tags(f"{before}@@{{{{< {inner} >}}}}@@{after}", HUGO_SHORTCODES)
    # What follows the tag is never eaten, whatever surrounds it.
    assert result.endswith(f"@@{after}") or "\n\n" in before or "{{<" in before


HOSTILE = {
    "pipes": "|" * MEGABYTE,
    "pipe table": "| h | h |\n|---|---|\n" + "| x " * (MEGABYTE // 4) + "\n",
    "pipe rows": "| a | b |\n|---|---|\n" + "|\n" * (MEGABYTE // 2),
    "backticks": "`" * MEGABYTE,
    "fence lines": "```\n" * (MEGABYTE // 4),
    "braces": "{" * MEGABYTE,
    "unclosed shortcodes": "{{< " * (MEGABYTE // 4),
    "unclosed tags mixed": "{{% {% {{ " * (MEGABYTE // 10),
    "closers only": ">}} %}} }} " * (MEGABYTE // 11),
    "shortcodes across paragraphs": ("{{< a\n\n" * (MEGABYTE // 8)) + ">}}",
    "brackets": "[" * (MEGABYTE // 2) + "](" * (MEGABYTE // 4),
    "links": "[a](" * (MEGABYTE // 4),
    "angles": "<a" * (MEGABYTE // 2),
    "comments": "<!--" * (MEGABYTE // 4),
    "one long line": "word " * (MEGABYTE // 5),
    "one long sentence-free line": "x" * MEGABYTE,
    "front matter unclosed": "---\n" + "k: v\n" * (MEGABYTE // 4),
    "dashes": "-" * MEGABYTE,
    "hashes": "#" * MEGABYTE,
    "spaces": " " * MEGABYTE + "x",
    "list markers": "* " * (MEGABYTE // 2),
    "indented": ("\n" + " " * 8 + "code") * (MEGABYTE // 13),
    "blank runs": "a.\n \n" * (MEGABYTE // 5),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_megabyte_in_linear_time(name: str) -> None:
    text = HOSTILE[name]
    started = time.perf_counter()
    sentences = evidence_sentences(text)
    elapsed = time.perf_counter() - started
    assert elapsed < BOUND_S, f"{name}: {elapsed:.1f} s"
    assert all(s and "\n" not in s for s in sentences)


def test_time_grows_linearly() -> None:
    """The cost of a hostile input grows linearly with its size."""

    def cost(n: int) -> float:
        text = ("| a | b |\n|--|--|\n| {{< x | `y` [z](" * n) + "\n"
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            evidence_sentences(text)
            best = min(best, time.perf_counter() - started)
        return best

    # Eight times the input: linear code takes about 8x as long, a quadratic step 64x.
    small, large = cost(2_000), cost(16_000)
    assert large < 24 * small + 0.05, (small, large)


def test_character_references_read_as_a_reader_sees_them() -> None:
    assert (
        inline_text("Possible Values: Number &gt;= 0 &amp; &#8804; 10")
        == "Possible Values: Number >= 0 & ≤ 10"
    )
    # An escaped tag is text, not a tag to strip; a bare ampersand stays as it is.
    assert inline_text("write &lt;b&gt; for bold, R&D") == "write <b> for bold, R&D"


def test_a_table_row_of_evidence_has_no_entities() -> None:
    text = "# Limits\n\n| Property | Possible Values |\n|---|---|\n| max_deliver | Number &gt;= 0 |\n"
    sentences = evidence_sentences(text)
    assert any("Number >= 0" in s for s in sentences), sentences
    assert not any("&gt;" in s for s in sentences)


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet="&#;x0123456789abcdefgtl <>", max_size=2000))
def test_references_are_decoded_in_linear_time(noise: str) -> None:
    started = time.perf_counter()
    inline_text(noise * 50)
    assert time.perf_counter() - started < 2.0
