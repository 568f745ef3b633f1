"""The sentences of a passage that can serve as evidence: prose, not markup.

Passages are chunks of real documents (Markdown with front matter, template shortcodes, tables,
code, HTML). An extractive answer or an extracted fact quoted from a table's pipe row, a code
line or a ``{% endhint %}`` tag reads as noise and supports nothing, so every "sentences of a
passage" call of the answering stages goes through ``evidence_sentences``:

- prose sentences, split with ``meshkit.text.answering.split_sentences``, inline markup removed
  (links keep their text, images their alt text, inline code its content);
- each Markdown table row under a header as ONE self-contained line, "Header1: value1; Header2:
  value2", so a row that holds the answer keeps the header that says what its cells mean (a
  row whose header is not in the passage, as when a chunk starts inside a table, is its cell
  values joined the same way: "value1; value2");
- nothing from fenced or indented code blocks, YAML/TOML front matter, template tags and
  shortcodes (``{{< >}}``, ``{{% %}}``, ``{% %}``, ``{{ }}``; the prose between a paired
  shortcode's tags stays), HTML tags and comments, link reference definitions, heading lines
  and other one-line labels that are not sentences, list markers.

Passage text is untrusted: every step is a scan with ``str.find`` or a regex that cannot
backtrack over a run, so a megabyte of pipes, backticks or braces costs linear time.

Beside it: markup.py (template tags, HTML and inline Markdown out), markdown_blocks.py
(paragraphs, list items, headings and table rows of a passage), front_matter.py (the front
matter block at a document's start).
"""

from __future__ import annotations

import itertools
import re

from meshkit.text.answering import content_words, split_sentences
from meshkit.text.front_matter import split_front_matter
from meshkit.text.markdown_blocks import blocks
from meshkit.text.markup import inline_text

_WORD = re.compile(r"[^\W\d_]{2,}")
# Characters that are common in code and rare in prose.
# (Not brackets, parentheses or comparisons: statistics in prose are full of them.)
_CODE_CHARS = frozenset("{};=$\\|`")
# A sentence with a larger share of code characters is a code fragment that escaped a block
# (a chunk can start inside a fence whose opening line is in the previous chunk).
_MAX_CODE_CHAR_SHARE = 0.12
# ... or a larger share of code-like tokens.
_MAX_CODE_TOKEN_SHARE = 0.4
_CODE_TOKEN = re.compile(r"[{}$\\|`]|//|::|->|==|!=|&&|[A-Za-z_]\(|\);")
# Two or more letters each side: "grpc.Dial", not "e.g." or "U.S.".
_DOTTED_NAME = re.compile(r"[A-Za-z_]{2}\.[A-Za-z_]{2}")
# A prose sentence has at least this many words of two or more letters.
_MIN_WORDS = 3
# A one-line paragraph without a sentence end is a heading or label unless it is this long.
_MIN_UNPUNCTUATED_WORDS = 8
_STATEMENT_END_CHARS = ".!\"')\u201d\u2019"
# Chunk text starts with the heading path "Title > Section > Sub" (services/ingestion/chunking).
_HEADING_PATH_SEPARATOR = " > "


def evidence_sentences(text: str) -> list[str]:
    """The sentences of a passage usable as evidence, in order (see the module docstring)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    front = split_front_matter(text)
    if front is not None:
        text = front.body
    sentences: list[str] = []
    for block in blocks(text.split("\n")):
        if block.row:
            if len(_WORD.findall(block.text)) >= _MIN_WORDS:
                sentences.append(block.text)
            continue
        plain = inline_text(block.text)
        if block.label_like and not _reads_as_sentence(plain):
            continue
        sentences.extend(s for s in split_sentences(plain) if _is_prose(s))
    return sentences


def _reads_as_sentence(plain: str) -> bool:
    """A heading or one-line paragraph is a sentence when it ends like a statement, or is long
    enough to be one; never when it is a chunk's heading path ("Title > Section")."""
    if _HEADING_PATH_SEPARATOR in plain and not plain.endswith((".", "!")):
        return False
    return plain[-1:] in _STATEMENT_END_CHARS or len(_WORD.findall(plain)) >= _MIN_UNPUNCTUATED_WORDS


def _is_prose(sentence: str) -> bool:
    """Enough words, not a question (it asserts nothing), not mostly code characters."""
    if sentence.endswith("?") or len(_WORD.findall(sentence)) < _MIN_WORDS:
        return False
    code_chars = sum(1 for c in sentence if c in _CODE_CHARS)
    if code_chars > _MAX_CODE_CHAR_SHARE * len(sentence):
        return False
    tokens = sentence.split()
    code_tokens = sum(1 for token in tokens if _is_code_token(token))
    # An assignment ("feature = stub.GetFeature(point)"), not a statistic ("n = 84", "p = .01").
    code_tokens += sum(
        1 for token, after in itertools.pairwise(tokens) if token == "=" and after[:1].isalpha()
    )
    return code_tokens <= _MAX_CODE_TOKEN_SHARE * len(tokens)


def _is_code_token(token: str) -> bool:
    """An operator, a call, or a dotted/snake_case identifier ("stub.GetFeature(point)")."""
    word = token.rstrip(".,:;!")
    return bool(_CODE_TOKEN.search(word)) or "_" in word.strip("_") or _DOTTED_NAME.search(word) is not None


def passage_sentences(text: str, title: str = "") -> list[str]:
    """The evidence sentences of a passage (facts, extractive answers, support checks), in
    order, without the title line chunks start with (it restates what the citation shows).
    Every "sentences of a passage" question of the answering stages goes through here."""
    title_words = content_words(title) if title else set()
    return [s for s in evidence_sentences(text) if content_words(s) and content_words(s) != title_words]
