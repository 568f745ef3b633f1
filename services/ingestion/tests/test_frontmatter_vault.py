"""Front matter as title and metadata, Obsidian wikilinks/embeds/tags, heading-only pages
(services.ingestion.frontmatter, services.ingestion.vault, their use in normalize)."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from meshkit.domain.metadata import metadata_problem
from meshkit.text.front_matter import split_front_matter
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.frontmatter import (
    MAX_FRONT_MATTER_KEYS,
    MAX_VALUE_CHARS,
    merged_metadata,
    parse_front_matter,
)
from services.ingestion.normalize import normalize
from services.ingestion.vault import inline_tags, link_text, resolve_vault_markdown, resolve_wikilinks

MD = ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN
HTML = ingestion_pb2.DOCUMENT_FORMAT_HTML
OBSIDIAN = ingestion_pb2.DOCUMENT_FORMAT_OBSIDIAN_MARKDOWN


def md(text: str, fmt: int = MD) -> tuple[str, str, dict[str, str]]:
    doc = normalize(text.encode(), fmt, "")
    return doc.markdown, doc.title, doc.metadata


def test_yaml_front_matter_is_title_and_metadata_not_body() -> None:
    page = (
        "---\ntitle: Quick start\ndescription: Run a gRPC service in minutes.\n"
        "tags: [Go, quickstart]\nweight: 10\ndraft: false\ndate: 2024-05-01\n"
        "aliases:\n  - /docs/quickstart/\n  - /qs/\nparams:\n  author: Ada\n---\n\n"
        "Install the tools first.\n"
    )
    markdown, title, metadata = md(page)
    assert title == "Quick start"
    # The description is the lead paragraph; no other front matter line is body text.
    assert markdown == "Run a gRPC service in minutes.\n\nInstall the tools first."
    assert metadata == {
        "weight": "10",
        "draft": "false",
        "date": "2024-05-01",
        "aliases": "/docs/quickstart/, /qs/",
        "params.author": "Ada",
        "tags": "go, quickstart",
        "tag:go": "true",
        "tag:quickstart": "true",
    }
    assert metadata_problem(metadata) is None


def test_toml_front_matter() -> None:
    page = '+++\ntitle = "Auth"\nkeywords = ["tls", "ALTS"]\n[params]\nlevel = 2\n+++\n\nUse TLS.\n'
    markdown, title, metadata = md(page)
    assert (markdown, title) == ("Use TLS.", "Auth")
    assert metadata == {
        "keywords": "tls, ALTS",
        "params.level": "2",
        "tags": "tls, alts",
        "tag:tls": "true",
        "tag:alts": "true",
    }


def test_malformed_front_matter_is_kept_as_body_without_a_crash() -> None:
    for page in (
        "---\ntitle: [unclosed\n---\n\nBody.\n",
        "+++\ntitle = \n+++\n\nBody.\n",
        "---\n- a list\n---\n\nBody.\n",
    ):
        markdown, _title, metadata = md(page)
        assert "Body." in markdown and metadata == {}
        assert page.split("\n")[1].strip("-+ ") in markdown


def test_yaml_is_loaded_safely_and_aliases_cannot_blow_up() -> None:
    unsafe = "---\ntitle: !!python/object/apply:os.system ['echo pwned']\n---\n\nBody.\n"
    markdown, title, metadata = md(unsafe)
    assert title == "" and metadata == {} and "Body." in markdown
    # Billion laughs: every level is nine references to the one before.
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    levels += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    bomb = "---\n" + "\n".join(levels) + "\n---\n\nBody.\n"
    started = time.monotonic()
    _markdown, _title, metadata = md(bomb)
    assert time.monotonic() - started < 2.0
    assert len(metadata) <= MAX_FRONT_MATTER_KEYS and all(
        len(v) <= MAX_VALUE_CHARS for v in metadata.values()
    )


def test_keys_are_made_filterable_and_bounded() -> None:
    fields = "\n".join(f"field {i}: value" for i in range(100))
    front = split_front_matter(f"---\n{fields}\nlong: {'y' * 5000}\n---\nbody")
    assert front is not None
    parsed = parse_front_matter(front, "---")
    assert parsed is not None
    assert len(parsed.metadata) == MAX_FRONT_MATTER_KEYS
    assert "field_0" in parsed.metadata and metadata_problem(parsed.metadata) is None


def test_caller_metadata_wins_and_the_total_stays_in_the_limit() -> None:
    document = {f"k{i}": "d" for i in range(70)} | {"team": "from-page"}
    merged = merged_metadata(document, {"team": "caller", "lang": "en"})
    assert merged["team"] == "caller" and merged["lang"] == "en"
    assert len(merged) == 64


def test_wikilinks_embeds_and_tags() -> None:
    page = (
        "---\ntags: [project]\n---\n\n"
        "See [[Meeting notes]] and [[people/Ada Lovelace.md|Ada]] or [[Setup#Linux]] and [[#Local]].\n"
        "![[diagram.png]] A block [[Spec#^ab12]]. #status/active #123 C#sharp #Project\n\n"
        "```\n[[not a link]] #notatag\n```\n\n"
        "Inline `[[code]] #code` stays.\n"
    )
    markdown, _title, metadata = md(page, OBSIDIAN)
    assert "See Meeting notes and Ada or Setup > Linux and Local." in markdown
    assert "diagram" not in markdown and "A block Spec." in markdown
    assert "[[not a link]] #notatag" in markdown and "`[[code]] #code`" in markdown
    assert metadata["tags"] == "project, status/active"
    assert metadata["tag:project"] == metadata["tag:status.active"] == "true"
    assert "tag:notatag" not in metadata and "tag:code" not in metadata and "tag:123" not in metadata


def test_plain_markdown_keeps_double_brackets_and_hashes() -> None:
    page = "---\ntags: [shell]\n---\n\nTest with [[ -f x ]] and [[Note]] #notatag.\n"
    markdown, _title, metadata = md(page)
    assert markdown == "Test with [[ -f x ]] and [[Note]] #notatag."
    assert metadata == {"tags": "shell", "tag:shell": "true"}


def test_link_text() -> None:
    assert link_text("Note") == "Note"
    assert link_text("dir/Note.md") == "Note"
    assert link_text("Note|  shown ") == "shown"
    assert link_text("Note#Part") == "Note > Part"
    assert link_text("Note#^block") == "Note"


def test_heading_only_pages_are_indexed_as_their_title() -> None:
    assert md("# Release notes\n") == ("Release notes", "Release notes", {})
    assert md("# API\n\n## Methods\n")[0] == "API\n\nMethods"
    html = normalize(b"<html><body><h1>Only a heading</h1></body></html>", HTML, "")
    assert html.markdown == "Only a heading"
    # A page with text is left alone.
    assert md("# T\n\nText.\n")[0] == "# T\n\nText."


_VAULT_ALPHABET = st.sampled_from(
    ["[[", "]]", "![[", "|", "#", "`", "```", "\n", " ", "a", "B", "1", "/", "^", "-"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_VAULT_ALPHABET, max_size=60).map("".join))
def test_vault_resolution_never_crashes_and_drops_no_prose(text: str) -> None:
    resolved = resolve_vault_markdown(text)
    # Outside links, every character stays: links only ever shrink the text.
    assert len(resolved.markdown) <= len(text)
    if "[[" not in text:
        assert resolved.markdown == text
    for tag in resolved.tags:
        assert tag and not tag.isdigit() and "#" not in tag


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab |#^", max_size=30), st.text(alphabet="xy ", max_size=20))
def test_a_wikilink_reads_as_its_link_text(target: str, before: str) -> None:
    if "]]" in target or "[[" in target or "\n" in target:
        return
    assert resolve_wikilinks(f"{before}[[{target}]]!") == f"{before}{link_text(target)}!"


def test_parsers_are_linear_on_hostile_input() -> None:
    n = 200_000
    for text in (
        "[[" * n,
        "[[a" * n + "]]",
        "![[" * n,
        "#a " * n,
        "#" * n,
        "`[[x" * n,
        "[[" + "x" * n + "]]",
    ):
        started = time.monotonic()
        resolve_vault_markdown(text)
        inline_tags(text)
        assert time.monotonic() - started < 2.0, text[:10]
