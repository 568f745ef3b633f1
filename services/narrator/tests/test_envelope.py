from __future__ import annotations

import pytest

from services.narrator.envelope import VisibleText, clean_output


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Plain answer [1].", "Plain answer [1]."),
        ("<answer>Inside [1].</answer>", "Inside [1]."),
        ("Preamble.\n<ANSWER>\nInside [1].\n</ANSWER>\nChangelog: removed claims.", "Inside [1]."),
        ("<answer>Cut off by the token limit [1]", "Cut off by the token limit [1]"),
        ("<think>reasoning</think>Answer [1].", "Answer [1]."),
        ("reasoning without an opening tag</think>\nAnswer [1].", "Answer [1]."),
        ("<think>reasoning that never ended", ""),
        ("<think>a</think><answer>b [1].</answer>", "b [1]."),
    ],
)
def test_clean_output(reply: str, expected: str) -> None:
    assert clean_output(reply) == expected


def run(chunks: list[str]) -> str:
    visible = VisibleText()
    return "".join(visible.feed(c) for c in chunks) + visible.flush()


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        (["Plain ", "answer [1]."], "Plain answer [1]."),
        (["<thi", "nk>hidden", " reasoning</th", "ink>Shown [1]."], "Shown [1]."),
        (["<ans", "wer>Shown [1].</answer>", " notes after"], "Shown [1]."),
        (["a < b and <b>bold</b> [1]."], "a < b and <b>bold</b> [1]."),
        (["ends with <"], "ends with <"),
        (["<think>never closed"], ""),
    ],
)
def test_visible_text_filters_deltas_like_clean_output(chunks: list[str], expected: str) -> None:
    assert run(chunks) == expected


def test_visible_text_holds_back_only_a_possible_tag() -> None:
    visible = VisibleText()
    assert visible.feed("Tall <") == "Tall "
    assert visible.feed("an") == ""
    assert visible.feed("d short>") == "<and short>"
