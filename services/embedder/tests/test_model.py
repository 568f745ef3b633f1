from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshkit.inference.onnxrt import CPU_PROVIDER, CUDA_PROVIDER, ProviderUnavailable, choose_providers
from meshkit.settings import EmbedderSettings
from services.embedder.model import EmbeddingModel, ModelLoadError, TextKind

SENTENCES = [
    "The cat sat on the mat.",
    "A kitten was resting on the rug.",
    "Interest rates were raised by the central bank to fight inflation.",
    "x",
    "Photosynthesis converts light energy into chemical energy in plants. " * 12,
    "Mitochondria are the powerhouse of the cell, producing ATP through respiration.",
]


def test_loads_on_cpu_and_reports_info(model: EmbeddingModel) -> None:
    assert model.info.provider == CPU_PROVIDER
    assert model.info.dimension == 384
    assert model.info.max_tokens == 256
    assert model.info.name == "all-MiniLM-L6-v2-int8"


def spinning_of(model: EmbeddingModel) -> str:
    return model._session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")


def test_threads_do_not_spin_unless_asked(model: EmbeddingModel, settings: EmbedderSettings) -> None:
    # Spinning threads take the cores the mesh's other services share (docs/BENCHMARKS.md).
    assert spinning_of(model) == "0"
    spinning = EmbeddingModel.load(settings.model_copy(update={"embedder_allow_spinning": True}))
    assert spinning_of(spinning) == "1"


@pytest.mark.parametrize("field", ["embedder_model_sha256", "embedder_tokenizer_sha256"])
def test_sha256_mismatch_fails_naming_file_and_hashes(settings: EmbedderSettings, field: str) -> None:
    bad = "0" * 64
    with pytest.raises(ModelLoadError) as err:
        EmbeddingModel.load(settings.model_copy(update={field: bad}))
    message = str(err.value)
    path = (
        settings.embedder_model_path if field == "embedder_model_sha256" else settings.embedder_tokenizer_path
    )
    assert path in message
    assert f"expected sha256 {bad}" in message
    assert getattr(settings, field) in message  # the actual hash


def test_missing_model_file_fails_clearly(settings: EmbedderSettings, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.onnx")
    with pytest.raises(ModelLoadError, match="model file not found"):
        EmbeddingModel.load(settings.model_copy(update={"embedder_model_path": missing}))


def test_vectors_are_normalised_384_dim_and_deterministic(model: EmbeddingModel) -> None:
    first, truncated = model.embed(SENTENCES, TextKind.PASSAGE)
    again, _ = model.embed(SENTENCES, TextKind.PASSAGE)
    assert first.shape == (len(SENTENCES), 384)
    assert first.dtype == np.float32
    assert truncated == 0
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(first, again)


def test_similar_sentences_are_closer_than_unrelated(model: EmbeddingModel) -> None:
    vectors, _ = model.embed(SENTENCES[:3], TextKind.PASSAGE)
    cat, kitten, rates = vectors
    assert float(cat @ kitten) > float(cat @ rates) + 0.2


def test_batch_equals_one_at_a_time(model: EmbeddingModel) -> None:
    batched, _ = model.embed(SENTENCES, TextKind.PASSAGE)
    single = np.vstack([model.embed([s], TextKind.PASSAGE)[0] for s in SENTENCES])
    np.testing.assert_allclose(batched, single, atol=1e-4)


def test_runs_split_by_max_batch_keep_input_order(model: EmbeddingModel, settings: EmbedderSettings) -> None:
    small = EmbeddingModel(
        settings.model_copy(update={"embedder_max_batch": 2}), model._session, model._tokenizer
    )
    split, _ = small.embed(SENTENCES, TextKind.PASSAGE)
    whole, _ = model.embed(SENTENCES, TextKind.PASSAGE)
    np.testing.assert_allclose(split, whole, atol=1e-4)


def test_truncation_is_counted(model: EmbeddingModel) -> None:
    long_text = "word " * 1000
    vectors, truncated = model.embed([long_text, "short text", long_text], TextKind.PASSAGE)
    assert truncated == 2
    _, flags = model.embed_with_flags([long_text, "short text"], TextKind.PASSAGE)
    assert flags.tolist() == [True, False]
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_prefixes_follow_the_text_kind(model: EmbeddingModel, settings: EmbedderSettings) -> None:
    e5_style = EmbeddingModel(
        settings.model_copy(
            update={"embedder_query_prefix": "query: ", "embedder_passage_prefix": "passage: "}
        ),
        model._session,
        model._tokenizer,
    )
    as_query, _ = e5_style.embed(["how do plants make energy"], TextKind.QUERY)
    as_passage, _ = e5_style.embed(["how do plants make energy"], TextKind.PASSAGE)
    manual, _ = model.embed(["query: how do plants make energy"], TextKind.QUERY)
    np.testing.assert_allclose(as_query, manual, atol=1e-6)
    assert not np.allclose(as_query, as_passage, atol=1e-3)


def test_empty_input_gives_empty_matrix(model: EmbeddingModel) -> None:
    vectors, truncated = model.embed([], TextKind.QUERY)
    assert vectors.shape == (0, 384)
    assert truncated == 0


def test_provider_choice() -> None:
    setting = "embedder_provider"
    assert choose_providers("cpu", [CUDA_PROVIDER, CPU_PROVIDER], setting) == [CPU_PROVIDER]
    assert choose_providers("auto", [CUDA_PROVIDER, CPU_PROVIDER], setting) == [CUDA_PROVIDER, CPU_PROVIDER]
    assert choose_providers("auto", [CPU_PROVIDER], setting) == [CPU_PROVIDER]
    assert choose_providers("cuda", [CUDA_PROVIDER, CPU_PROVIDER], setting) == [CUDA_PROVIDER, CPU_PROVIDER]
    with pytest.raises(ProviderUnavailable, match=r"embedder_provider=cuda.*onnxruntime-gpu"):
        choose_providers("cuda", [CPU_PROVIDER], setting)


def test_runs_respect_batch_and_token_budgets(model: EmbeddingModel, settings: EmbedderSettings) -> None:
    planner = EmbeddingModel(
        settings.model_copy(update={"embedder_max_batch": 64, "embedder_max_run_tokens": 1024}),
        model._session,
        model._tokenizer,
    )
    assert [len(r) for r in planner._plan_runs([10] * 100)] == [64, 36]
    assert [len(r) for r in planner._plan_runs([200] * 12)] == [5, 5, 2]
    # A row longer than the budget still runs, alone; rows come out sorted by length.
    runs = planner._plan_runs([300, 5, 2000, 7])
    assert runs == [[1, 3, 0], [2]]


def test_cpu_default_token_budget(model: EmbeddingModel) -> None:
    assert model.max_run_tokens == 1024


def test_token_budget_split_keeps_vectors(model: EmbeddingModel, settings: EmbedderSettings) -> None:
    tiny = EmbeddingModel(
        settings.model_copy(update={"embedder_max_run_tokens": 40}), model._session, model._tokenizer
    )
    split, _ = tiny.embed(SENTENCES, TextKind.PASSAGE)
    whole, _ = model.embed(SENTENCES, TextKind.PASSAGE)
    np.testing.assert_allclose(split, whole, atol=1e-4)


def test_a_page_long_query_embeds_what_the_model_reads(model: EmbeddingModel) -> None:
    # The gateway takes queries up to 16,000 characters: the embedder cuts one to its token
    # limit (no error) and flags it, and its vector is that of its opening.
    query = ("How do hybrid retrieval systems rank documents for a long question? " * 250)[:16_000]
    vectors, flags = model.embed_with_flags([query, query[:4000]], TextKind.QUERY)
    assert flags.tolist() == [True, True]
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
