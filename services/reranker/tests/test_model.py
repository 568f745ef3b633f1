from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Encoding

from meshkit.inference.onnxrt import CPU_PROVIDER, CUDA_PROVIDER
from services.reranker.model import (
    MANIFEST,
    MODEL_FILE,
    SINGLE_LOGIT,
    TOKENIZER_FILE,
    TWO_CLASS,
    CrossEncoderModel,
    ModelLoadError,
)
from services.reranker.tests.conftest import (
    MAX_QUERY_TOKENS,
    MAX_TOKENS,
    MODEL_NAME,
    ONNX_IR_VERSION,
    ONNX_OPSET,
    ModelDirFactory,
    cells,
)

QUERIES = ["cell", "what about a cell", "x", "cell cell", "q", "cell of a cell", "plain"]
# Lengths that do not follow the input order, so a run sorted by length must be put back in order.
FILLER = [9, 0, 5, 1, 12, 3, 7]
PASSAGES = [f"{'cell ' * i}{'word ' * n}end" for i, n in enumerate(FILLER)]


def expected(queries: Sequence[str], passages: Sequence[str]) -> list[float]:
    return [float(cells(q) + cells(p)) for q, p in zip(queries, passages, strict=True)]


def tokens(model: CrossEncoderModel, text: str) -> int:
    return len(model.tokenizer.encode(text, add_special_tokens=False).ids)


def passage_tokens(encoding: Encoding) -> int:
    # BERT pairs are [CLS] query [SEP] passage [SEP], the passage and its [SEP] typed 1.
    return sum(encoding.type_ids) - 1


def test_single_logit_scores_follow_the_graph(cell_model: CrossEncoderModel) -> None:
    passages = ["a cell and a cell", "nothing here", "cell"]
    scores, truncated = cell_model.score("which cell", passages)
    assert cell_model.head == SINGLE_LOGIT
    assert cell_model.provider == CPU_PROVIDER
    assert scores.dtype == np.float32
    assert scores.tolist() == [3.0, 1.0, 2.0]
    assert truncated.tolist() == [False, False, False]


def test_threads_spin_only_when_asked(cell_model_dir: Path) -> None:
    def spinning(model: CrossEncoderModel) -> str:
        options = model.session.get_session_options()
        return options.get_session_config_entry("session.intra_op.allow_spinning")

    assert spinning(CrossEncoderModel.load(cell_model_dir, provider="cpu")) == "0"
    assert spinning(CrossEncoderModel.load(cell_model_dir, provider="cpu", spinning=True)) == "1"


@pytest.mark.parametrize("head", [TWO_CLASS, "auto"])
def test_two_class_head_is_read_as_the_logit_difference(make_model_dir: ModelDirFactory, head: str) -> None:
    model = CrossEncoderModel.load(make_model_dir(width=2, head=head), provider="cpu")
    assert model.head == TWO_CLASS
    # logits are (-s, s): their difference is 2s, a softmax would have squashed it into (0, 1).
    assert model.score_pairs(["cell", "x"], ["cell cell", "nothing"]).tolist() == [6.0, 0.0]


def test_auto_head_of_a_single_logit_graph(make_model_dir: ModelDirFactory) -> None:
    model = CrossEncoderModel.load(make_model_dir(head="auto"), provider="cpu")
    assert model.head == SINGLE_LOGIT


def test_calibration_scale_and_bias_apply(make_model_dir: ModelDirFactory) -> None:
    model_dir = make_model_dir(extra={"score_scale": 0.5, "score_bias": -1.0})
    model = CrossEncoderModel.load(model_dir, provider="cpu")
    scores = model.score_pairs(["cell", "cell", "x"], ["cell cell cell", "none", "none"])
    assert scores.tolist() == [1.0, -0.5, -1.0]


def test_graph_without_token_type_ids(make_model_dir: ModelDirFactory) -> None:
    model = CrossEncoderModel.load(make_model_dir(token_types=False), provider="cpu")
    assert "token_type_ids" not in {i.name for i in model.session.get_inputs()}
    assert model.score_pairs(QUERIES, PASSAGES).tolist() == expected(QUERIES, PASSAGES)


def test_small_runs_give_the_scores_of_one_run_in_input_order(
    cell_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = CrossEncoderModel.load(cell_model_dir, provider="cpu", max_batch=64)
    small = CrossEncoderModel.load(cell_model_dir, provider="cpu", max_batch=2)
    run_sizes: list[int] = []
    run = small._run

    def counting_run(encodings: Sequence[Encoding]) -> np.ndarray:
        run_sizes.append(len(encodings))
        return run(encodings)

    monkeypatch.setattr(small, "_run", counting_run)
    small_scores, small_truncated = small.score_pairs_with_flags(QUERIES, PASSAGES)
    whole_scores, whole_truncated = whole.score_pairs_with_flags(QUERIES, PASSAGES)
    assert run_sizes == [2, 2, 2, 1]
    assert not small_truncated.any() and not whole_truncated.any()
    assert small_scores.tolist() == whole_scores.tolist() == expected(QUERIES, PASSAGES)


def test_mismatched_pairs_are_refused(cell_model: CrossEncoderModel) -> None:
    with pytest.raises(ValueError, match="2 queries for 1 passages"):
        cell_model.score_pairs(["a", "b"], ["c"])


def test_pairs_never_exceed_the_token_limit(cell_model: CrossEncoderModel) -> None:
    queries = ["cell", "a much longer question " * 10, "q", "cell " * 40]
    passages = ["short passage", "word " * 200, "a few words here", "cell " * 3]
    encodings, truncated = cell_model.encode_pairs(queries, passages)
    assert all(len(e.ids) <= MAX_TOKENS for e in encodings)
    assert truncated.tolist() == [False, True, False, False]


def test_a_passage_that_just_fits_is_not_truncated(cell_model: CrossEncoderModel) -> None:
    room = MAX_TOKENS - 3 - tokens(cell_model, "q")
    fits, over = "word " * room, "word " * (room + 1)
    assert tokens(cell_model, fits) == room
    encodings, truncated = cell_model.encode_pairs(["q", "q"], [fits, over])
    assert [len(e.ids) for e in encodings] == [MAX_TOKENS, MAX_TOKENS]
    assert truncated.tolist() == [False, True]


def test_the_query_is_kept_whole_and_the_passage_cut_from_its_end(cell_model: CrossEncoderModel) -> None:
    query = "cell cell cell"
    long_tail = "word " * 200 + "cell"  # the passage's only match lies past the cut
    long_head = "cell " + "word " * 200  # ... and here before it
    scores, truncated = cell_model.score(query, [long_tail, long_head])
    assert scores.tolist() == [3.0, 4.0]
    assert truncated.tolist() == [True, True]


def test_an_overlong_query_is_capped_and_the_passage_keeps_its_room(cell_model: CrossEncoderModel) -> None:
    query, passage = "cell " * 50, "cell " * 50
    encodings, truncated = cell_model.encode_pairs([query], [passage])
    room = MAX_TOKENS - 3 - MAX_QUERY_TOKENS
    assert len(encodings[0].ids) == MAX_TOKENS
    assert passage_tokens(encodings[0]) == room
    assert truncated.tolist() == [True]
    assert cell_model.score_pairs([query], [passage]).tolist() == [float(MAX_QUERY_TOKENS + room)]


def test_a_page_long_query_is_read_to_its_token_cap_once_for_every_pair(
    cell_model: CrossEncoderModel,
) -> None:
    # The gateway takes queries up to 16,000 characters: the model reads the first
    # MAX_QUERY_TOKENS tokens of one, however many passages share it, and scores as for those.
    query = ("cell " * 4000)[:16_000]
    passages = [f"cell {'word ' * i}" for i in range(200)]
    encodings, truncated = cell_model.encode_pairs([query] * len(passages), passages)
    assert all(len(e.ids) <= MAX_TOKENS for e in encodings)
    head = " ".join(["cell"] * MAX_QUERY_TOKENS)
    scores = cell_model.score(query, passages[:3])[0]
    assert scores.tolist() == cell_model.score(head, passages[:3])[0].tolist()
    assert truncated.tolist() == cell_model.encode_pairs([head] * len(passages), passages)[1].tolist()


@pytest.mark.parametrize(("requested", "limit", "query_limit"), [(0, 64, 16), (100, 64, 16), (20, 20, 8)])
def test_a_smaller_token_limit_at_load_wins(
    make_model_dir: ModelDirFactory, requested: int, limit: int, query_limit: int
) -> None:
    model_dir = make_model_dir(max_tokens=64, max_query_tokens=16)
    model = CrossEncoderModel.load(model_dir, provider="cpu", max_tokens=requested)
    assert (model.max_tokens, model.max_query_tokens) == (limit, query_limit)
    encodings, truncated = model.encode_pairs(["cell " * 40], ["word " * 100])
    assert len(encodings[0].ids) == limit
    assert passage_tokens(encodings[0]) == limit - 3 - query_limit
    assert truncated.tolist() == [True]


def test_manifest_fields_are_read(cell_model: CrossEncoderModel, cell_model_dir: Path) -> None:
    manifest = json.loads((cell_model_dir / MANIFEST).read_text())
    assert cell_model.manifest.name == MODEL_NAME
    assert cell_model.model_sha256 == manifest["files"][MODEL_FILE]
    assert (cell_model.max_tokens, cell_model.max_query_tokens) == (MAX_TOKENS, MAX_QUERY_TOKENS)


def test_missing_manifest(make_model_dir: ModelDirFactory) -> None:
    model_dir = make_model_dir()
    (model_dir / MANIFEST).unlink()
    with pytest.raises(ModelLoadError, match="needs a manifest"):
        CrossEncoderModel.load(model_dir, provider="cpu")


@pytest.mark.parametrize("name", [MODEL_FILE, TOKENIZER_FILE])
def test_tampered_file_fails_its_checksum(make_model_dir: ModelDirFactory, name: str) -> None:
    model_dir = make_model_dir()
    with (model_dir / name).open("ab") as f:
        f.write(b" ")
    with pytest.raises(ModelLoadError, match=re.escape(f"{name} failed its integrity check")):
        CrossEncoderModel.load(model_dir, provider="cpu")


def test_listed_file_missing(make_model_dir: ModelDirFactory) -> None:
    model_dir = make_model_dir()
    (model_dir / TOKENIZER_FILE).unlink()
    with pytest.raises(ModelLoadError, match="listed in the manifest"):
        CrossEncoderModel.load(model_dir, provider="cpu")


@pytest.mark.parametrize(
    ("manifest", "fragment"),
    [
        ("{not json", "unreadable manifest"),
        (json.dumps({"head": "sigmoid", "files": {MODEL_FILE: "", TOKENIZER_FILE: ""}}), "head must be"),
        (json.dumps({"head": "auto", "files": {MODEL_FILE: "0" * 64}}), "'files' must give"),
    ],
)
def test_malformed_manifest(make_model_dir: ModelDirFactory, manifest: str, fragment: str) -> None:
    model_dir = make_model_dir()
    (model_dir / MANIFEST).write_text(manifest)
    with pytest.raises(ModelLoadError, match=fragment):
        CrossEncoderModel.load(model_dir, provider="cpu")


@pytest.mark.parametrize(("width", "head"), [(2, SINGLE_LOGIT), (1, TWO_CLASS)])
def test_head_that_disagrees_with_the_graph(make_model_dir: ModelDirFactory, width: int, head: str) -> None:
    with pytest.raises(ModelLoadError, match=f"the manifest says head={head}"):
        CrossEncoderModel.load(make_model_dir(width=width, head=head), provider="cpu")


def test_three_logit_output_is_not_a_cross_encoder(make_model_dir: ModelDirFactory) -> None:
    with pytest.raises(ModelLoadError, match="not a 1- or 2-logit classifier"):
        CrossEncoderModel.load(make_model_dir(width=3, head="auto"), provider="cpu")


@pytest.mark.skipif(CUDA_PROVIDER in ort.get_available_providers(), reason="CUDA is available here")
def test_cuda_requested_but_unavailable(cell_model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="reranker_provider=cuda"):
        CrossEncoderModel.load(cell_model_dir, provider="cuda")


def token_classifier_graph() -> onnx.ModelProto:
    """Per-token logits [batch, seq, 2] (a NER-style head): not one score per pair."""
    seq = ["batch", "seq"]
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["ids_f", "mask_f"], ["kept"]),
            helper.make_node("Unsqueeze", ["kept", "last"], ["column"]),
            helper.make_node("Concat", ["column", "column"], ["logits"], axis=2),
        ],
        "token_classifier",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, seq),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, seq),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [*seq, 2])],
        initializer=[numpy_helper.from_array(np.array([2], dtype=np.int64), "last")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    return model


def test_a_per_token_output_is_not_a_cross_encoder(make_model_dir: ModelDirFactory) -> None:
    model_dir = make_model_dir(graph=token_classifier_graph(), head="auto")
    with pytest.raises(ModelLoadError, match="not a 1- or 2-logit classifier"):
        CrossEncoderModel.load(model_dir, provider="cpu")


@pytest.mark.parametrize(
    "manifest",
    [
        [],
        {"max_tokens": "many", "files": {MODEL_FILE: "0" * 64, TOKENIZER_FILE: "0" * 64}},
    ],
)
def test_ill_typed_manifest_is_a_load_error(make_model_dir: ModelDirFactory, manifest: object) -> None:
    model_dir = make_model_dir()
    (model_dir / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError):
        CrossEncoderModel.load(model_dir, provider="cpu")


def test_a_limit_too_small_for_a_pair_is_refused_or_kept(make_model_dir: ModelDirFactory) -> None:
    model_dir = make_model_dir(max_tokens=4, max_query_tokens=2)
    try:
        model = CrossEncoderModel.load(model_dir, provider="cpu")
    except ModelLoadError:
        return
    encodings, _ = model.encode_pairs(["cell cell"], ["word word"])
    assert len(encodings[0].ids) <= 4
