"""ONNX sentence-embedding model: tokenizer + ONNX Runtime session + pooling, no torch.

``EmbeddingModel.embed`` is synchronous and thread-safe; the service calls it from a worker thread
through the micro-batcher, benchmarks call it directly for raw in-process throughput.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from meshkit.domain.ids import sha256_file
from meshkit.inference.onnxrt import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    ProviderUnavailable,
    choose_providers,
    session_options,
)
from meshkit.settings import EmbedderSettings

log = logging.getLogger("ragmesh.embedder.model")


# Measured on 2 CPU cores: past ~1k padded tokens per run throughput drops (64 x 200-token passages
# run ~35% slower per text than 4-8 at a time) as the attention buffers fall out of cache.
_CPU_RUN_TOKENS = 1024

_REQUIRED_INPUTS = ("input_ids", "attention_mask")
_OPTIONAL_INPUTS = ("token_type_ids",)
# A sentence-transformers export that pools inside the graph names its output this. BERT's
# `pooler_output` (CLS + dense + tanh) is deliberately not used: it is not the sentence embedding.
_POOLED_OUTPUT = "sentence_embedding"


class TextKind(enum.Enum):
    """Asymmetric models embed queries and passages with different prefixes."""

    QUERY = "query"
    PASSAGE = "passage"


class ModelLoadError(RuntimeError):
    """The model or tokenizer is missing, tampered with, or not a usable embedding model."""


@dataclass(frozen=True)
class ModelInfo:
    name: str
    dimension: int
    max_tokens: int
    query_prefix: str
    passage_prefix: str
    provider: str
    # sha256 of the model file actually loaded (pinned or not): part of the identity a
    # collection records (meshkit.domain.collections), so an unpinned swap is still noticed.
    sha256: str = ""


def verify_file(path: Path, expected_sha256: str, what: str) -> str:
    """The file's sha256; refuses a file whose content is not the pinned one ('' pins nothing)."""
    if not path.is_file():
        raise ModelLoadError(f"{what} file not found: {path}")
    actual = sha256_file(path)
    if expected_sha256 and actual != expected_sha256.lower():
        raise ModelLoadError(
            f"{what} file {path} failed its integrity check: expected sha256 {expected_sha256}, got {actual}"
        )
    return actual


class EmbeddingModel:
    """A loaded embedding model. Build it with ``EmbeddingModel.load(settings)``."""

    def __init__(
        self,
        settings: EmbedderSettings,
        session: ort.InferenceSession,
        tokenizer: Tokenizer,
        model_sha256: str = "",
    ) -> None:
        self._settings = settings
        self._session = session
        self._tokenizer = tokenizer
        self._input_names = {i.name for i in session.get_inputs()}
        self._output_name, self._pooled_by_model = _pick_output(session)
        self.dimension = settings.embedder_dimension
        self.max_tokens = settings.embedder_max_tokens
        self.max_batch = settings.embedder_max_batch
        self.max_run_tokens = _run_token_budget(settings, session.get_providers()[0])
        self.info = ModelInfo(
            name=settings.embedder_model_name,
            dimension=settings.embedder_dimension,
            max_tokens=settings.embedder_max_tokens,
            query_prefix=settings.embedder_query_prefix,
            passage_prefix=settings.embedder_passage_prefix,
            provider=session.get_providers()[0],
            sha256=model_sha256,
        )

    @classmethod
    def load(cls, settings: EmbedderSettings) -> EmbeddingModel:
        started = time.perf_counter()
        model_path = Path(settings.embedder_model_path)
        tokenizer_path = Path(settings.embedder_tokenizer_path)
        model_sha256 = verify_file(model_path, settings.embedder_model_sha256, "model")
        verify_file(tokenizer_path, settings.embedder_tokenizer_sha256, "tokenizer")
        tokenizer = _load_tokenizer(tokenizer_path, settings.embedder_max_tokens)
        session = _load_session(model_path, settings)
        model = cls(settings, session, tokenizer, model_sha256)
        model._check_dimension()
        if settings.embedder_provider == "cuda" and model.info.provider != CUDA_PROVIDER:
            raise ModelLoadError(f"CUDA was requested but ONNX Runtime fell back to {model.info.provider}")
        log.info(
            "model loaded",
            extra={
                "model": settings.embedder_model_name,
                "provider": model.info.provider,
                "output": model._output_name,
                "ms": round((time.perf_counter() - started) * 1000, 1),
            },
        )
        return model

    def prefix_for(self, kind: TextKind) -> str:
        return self.info.query_prefix if kind is TextKind.QUERY else self.info.passage_prefix

    def embed(self, texts: Sequence[str], kind: TextKind) -> tuple[np.ndarray, int]:
        """L2-normalised float32 vectors [len(texts), dim] in input order, and how many were truncated."""
        vectors, truncated = self.embed_with_flags(texts, kind)
        return vectors, int(truncated.sum())

    def embed_with_flags(self, texts: Sequence[str], kind: TextKind) -> tuple[np.ndarray, np.ndarray]:
        """Like ``embed`` but with a per-text truncation flag, so a batch can be split back per caller."""
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out, np.zeros(0, dtype=bool)
        prefix = self.prefix_for(kind)
        encodings = self._tokenizer.encode_batch([prefix + t for t in texts])
        # With truncation on, the cut-off tail lands in `overflowing`: a cheap "was truncated" test.
        truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings))
        for rows in self._plan_runs([len(e.ids) for e in encodings]):
            out[rows] = self._run([encodings[i] for i in rows])
        return out, truncated

    def _plan_runs(self, lengths: Sequence[int]) -> list[list[int]]:
        """Group row indexes into ONNX runs of similar length within the batch and token budgets."""
        # Sorted by length, each run pads only to lengths close to its own; the newest row is
        # always the run's longest, so rows * its length is the run's padded size.
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        runs: list[list[int]] = []
        current: list[int] = []
        for i in order:
            padded = (len(current) + 1) * lengths[i]
            if current and (len(current) >= self.max_batch or padded > self.max_run_tokens):
                runs.append(current)
                current = []
            current.append(i)
        if current:
            runs.append(current)
        return runs

    def _run(self, encodings: Sequence[Encoding]) -> np.ndarray:
        feeds, mask = self._feeds(encodings)
        output = self._session.run([self._output_name], feeds)[0]
        pooled = output if self._pooled_by_model else self._pool(output, mask)
        return _l2_normalise(pooled.astype(np.float32, copy=False))

    def _feeds(self, encodings: Sequence[Encoding]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        # Pad to the longest sequence of this run, not to max_tokens: attention cost grows with length.
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._input_names:
            feeds["token_type_ids"] = types
        return feeds, mask

    def _pool(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self._settings.embedder_pooling == "cls":
            return tokens[:, 0, :]
        weights = mask[..., None].astype(np.float32)
        summed = (tokens * weights).sum(axis=1)
        counts = np.maximum(weights.sum(axis=1), 1.0)
        return summed / counts

    def _check_dimension(self) -> None:
        probe, _ = self.embed(["dimension probe"], TextKind.PASSAGE)
        if probe.shape[1] != self.dimension:
            raise ModelLoadError(
                f"model produces {probe.shape[1]}-dim vectors but embedder_dimension is {self.dimension}"
            )


def _run_token_budget(settings: EmbedderSettings, provider: str) -> int:
    if settings.embedder_max_run_tokens > 0:
        return settings.embedder_max_run_tokens
    if provider == CPU_PROVIDER:
        return _CPU_RUN_TOKENS
    # A GPU wants the biggest runs it can get: only max_batch limits them.
    return settings.embedder_max_batch * settings.embedder_max_tokens


def _l2_normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def _load_tokenizer(path: Path, max_tokens: int) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read tokenizer {path}: {exc}") from exc
    # The shipped tokenizer.json pads every input to a fixed 128 and truncates at 128: replace both.
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


def _load_session(path: Path, settings: EmbedderSettings) -> ort.InferenceSession:
    options = session_options(settings.embedder_intra_op_threads, settings.embedder_allow_spinning)
    try:
        providers = choose_providers(
            settings.embedder_provider, ort.get_available_providers(), "embedder_provider"
        )
    except ProviderUnavailable as exc:
        raise ModelLoadError(str(exc)) from exc
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as exc:
        raise ModelLoadError(f"cannot load ONNX model {path}: {exc}") from exc
    _check_inputs(session, path)
    return session


def _check_inputs(session: ort.InferenceSession, path: Path) -> None:
    names = [i.name for i in session.get_inputs()]
    missing = [n for n in _REQUIRED_INPUTS if n not in names]
    unknown = [n for n in names if n not in _REQUIRED_INPUTS + _OPTIONAL_INPUTS]
    if missing or unknown:
        raise ModelLoadError(
            f"{path} is not a BERT-style encoder: inputs {names} (missing {missing}, unsupported {unknown})"
        )


def _pick_output(session: ort.InferenceSession) -> tuple[str, bool]:
    """The output to read and whether the model already pooled it ([batch, dim] vs [batch, seq, dim])."""
    outputs: list[Any] = list(session.get_outputs())
    for out in outputs:
        if out.name == _POOLED_OUTPUT and len(out.shape) == 2:
            return out.name, True
    for out in outputs:
        if len(out.shape) == 3:
            return out.name, False
    shapes = {o.name: o.shape for o in outputs}
    raise ModelLoadError(f"no [batch, seq, dim] token output or {_POOLED_OUTPUT!r} output in {shapes}")
