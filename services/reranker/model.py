"""Cross-encoder runtime: a model directory (ONNX graph, tokenizer.json, manifest.json) scored with
ONNX Runtime alone (no torch).

Any Hugging Face sequence-classification cross-encoder exported to ONNX works (BERT, MiniLM, XLM-R):
inputs ``input_ids``/``attention_mask`` and, when the graph has it, ``token_type_ids``; one output of
shape [batch, 1] (a relevance logit) or [batch, 2] (two classes, read as the logit difference, the
log-odds of "relevant"). Raw logits are used: a sigmoid or softmax would flatten single-logit heads
and make the threshold meaningless. The manifest may declare a calibration (scale, bias) that puts
the logit on a log-odds scale.

``CrossEncoderModel.score_pairs`` is synchronous and thread-safe; the service runs it in the
micro-batcher's thread, benchmarks call it directly.
"""

from __future__ import annotations

import json
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
from meshkit.inference.onnxrt import CUDA_PROVIDER, ProviderUnavailable, choose_providers, session_options
from services.reranker.window import WindowPolicy, best_start, content_ids, word_start

log = logging.getLogger("ragmesh.reranker.model")

MANIFEST = "manifest.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
SINGLE_LOGIT, TWO_CLASS = "single_logit", "two_class"


class ModelLoadError(RuntimeError):
    """The model directory is missing a file, fails its checksums, or is not a cross-encoder."""


@dataclass(frozen=True)
class Manifest:
    name: str
    head: str  # single_logit, two_class, or auto (read from the graph's output shape)
    max_tokens: int
    max_query_tokens: int
    score_scale: float
    score_bias: float
    files: dict[str, str]

    @classmethod
    def read(cls, model_dir: Path) -> Manifest:
        path = model_dir / MANIFEST
        if not path.is_file():
            raise ModelLoadError(
                f"{path} not found: a model directory needs a manifest (see models/README.md)"
            )
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{path}: unreadable manifest: {exc}") from exc
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path}: the manifest must be a JSON object")
        head = raw.get("head", "auto")
        if head not in (SINGLE_LOGIT, TWO_CLASS, "auto"):
            raise ModelLoadError(f"{path}: head must be single_logit, two_class or auto, not {head!r}")
        files = raw.get("files", {})
        if not isinstance(files, dict) or MODEL_FILE not in files or TOKENIZER_FILE not in files:
            raise ModelLoadError(f"{path}: 'files' must give the sha256 of {MODEL_FILE} and {TOKENIZER_FILE}")
        try:
            return cls(
                name=str(raw.get("name") or model_dir.name),
                head=head,
                max_tokens=int(raw.get("max_tokens", 512)),
                max_query_tokens=int(raw.get("max_query_tokens", 64)),
                score_scale=float(raw.get("score_scale", 1.0)),
                score_bias=float(raw.get("score_bias", 0.0)),
                files={str(k): str(v).lower() for k, v in files.items()},
            )
        except (TypeError, ValueError) as exc:
            raise ModelLoadError(f"{path}: a numeric field is not a number: {exc}") from exc


def verify_files(model_dir: Path, manifest: Manifest) -> None:
    for name, expected in manifest.files.items():
        path = model_dir / name
        if not path.is_file():
            raise ModelLoadError(f"{path} not found (listed in the manifest)")
        actual = sha256_file(path)
        if actual != expected:
            raise ModelLoadError(
                f"{path} failed its integrity check: expected sha256 {expected}, got {actual}"
            )


def head_of(session: ort.InferenceSession, declared: str) -> str:
    """The head the graph has; a manifest that disagrees with the graph is refused."""
    output = session.get_outputs()[0]
    # [batch] or [batch, 1]: one logit; [batch, 2]: two classes. Anything else (per-token logits,
    # more classes, an embedding) is not a relevance head.
    width = output.shape[1] if len(output.shape) == 2 else 1 if len(output.shape) == 1 else None
    found = TWO_CLASS if width == 2 else SINGLE_LOGIT if width == 1 else None
    if found is None:
        raise ModelLoadError(f"output {output.name} has shape {output.shape}: not a 1- or 2-logit classifier")
    if declared != "auto" and declared != found:
        raise ModelLoadError(f"the manifest says head={declared} but the graph's output is {output.shape}")
    return found


class CrossEncoderModel:
    """A loaded cross-encoder. Build it with ``CrossEncoderModel.load(model_dir)``."""

    def __init__(
        self,
        manifest: Manifest,
        session: ort.InferenceSession,
        tokenizer: Tokenizer,
        *,
        max_tokens: int,
        max_batch: int,
        window: WindowPolicy = "head",
        window_head_tokens: int = 0,
    ) -> None:
        self.manifest = manifest
        self.window = window
        self.window_head_tokens = window_head_tokens
        self.session = session
        self.tokenizer = tokenizer
        self.head = head_of(session, manifest.head)
        self.max_tokens = max_tokens
        self.max_batch = max_batch
        self.provider = session.get_providers()[0]
        self.model_sha256 = manifest.files[MODEL_FILE]
        self._inputs = {i.name for i in session.get_inputs()}
        self._output = session.get_outputs()[0].name
        missing = {"input_ids", "attention_mask"} - self._inputs
        if missing:
            raise ModelLoadError(f"the graph lacks inputs {sorted(missing)}")
        self._special = tokenizer.num_special_tokens_to_add(True)
        if max_tokens < self._special + 2:
            raise ModelLoadError(
                f"max_tokens {max_tokens} leaves no room for a query and a passage "
                f"({self._special} special tokens per pair)"
            )
        # The query never takes more than half the room: the passage is what is being judged.
        self.max_query_tokens = max(1, min(manifest.max_query_tokens, (max_tokens - self._special) // 2))

    @classmethod
    def load(
        cls,
        model_dir: Path,
        *,
        provider: str = "auto",
        max_tokens: int = 0,
        max_batch: int = 64,
        threads: int = 0,
        spinning: bool = False,
        window: WindowPolicy = "head",
        window_head_tokens: int = 0,
    ) -> CrossEncoderModel:
        """``max_tokens`` 0 keeps the manifest's limit; a smaller one trades quality for speed.
        ``window`` picks what a long passage keeps (see ``services.reranker.window``)."""
        started = time.perf_counter()
        manifest = Manifest.read(model_dir)
        verify_files(model_dir, manifest)
        limit = min(max_tokens, manifest.max_tokens) if max_tokens > 0 else manifest.max_tokens
        tokenizer = _load_tokenizer(model_dir / TOKENIZER_FILE)
        session = _load_session(model_dir / MODEL_FILE, provider, threads, spinning)
        model = cls(
            manifest,
            session,
            tokenizer,
            max_tokens=limit,
            max_batch=max_batch,
            window=window,
            window_head_tokens=window_head_tokens,
        )
        if provider == "cuda" and model.provider != CUDA_PROVIDER:
            raise ModelLoadError(f"CUDA was requested but ONNX Runtime fell back to {model.provider}")
        log.info(
            "model loaded",
            extra={
                "model": manifest.name,
                "head": model.head,
                "provider": model.provider,
                "max_tokens": limit,
                "window": window,
                "ms": round((time.perf_counter() - started) * 1000, 1),
            },
        )
        return model

    def score(self, query: str, passages: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Scores and truncation flags of ``passages`` against one query."""
        return self.score_pairs_with_flags([query] * len(passages), passages)

    def score_pairs(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        return self.score_pairs_with_flags(queries, passages)[0]

    def score_pairs_with_flags(
        self, queries: Sequence[str], passages: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries for {len(passages)} passages")
        encodings, truncated = self.encode_pairs(queries, passages)
        scores = np.empty(len(encodings), dtype=np.float32)
        # A run is padded to its longest pair: runs are formed from pairs of similar length.
        order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self.max_batch):
            rows = order[start : start + self.max_batch]
            scores[rows] = self._run([encodings[i] for i in rows])
        return scores, truncated

    def encode_pairs(
        self, queries: Sequence[str], passages: Sequence[str]
    ) -> tuple[list[Encoding], np.ndarray]:
        """Token pairs within the model's limit. The query is kept whole up to its own cap (a
        pathological query must not push the passage out); the passage takes the rest: its head,
        or with ``overlap`` windows its opening and the span that matches the query best. Each
        distinct query is tokenised once: a long one (up to reranker_max_query_chars) shared by
        every pair of a call is not read again per passage."""
        distinct = list(dict.fromkeys(queries))
        encoded = self.tokenizer.encode_batch(distinct, add_special_tokens=False)
        for encoding in encoded:
            encoding.truncate(self.max_query_tokens)
        by_query = dict(zip(distinct, encoded, strict=True))
        query_tokens = [by_query[query] for query in queries]
        passage_tokens = self.tokenizer.encode_batch(list(passages), add_special_tokens=False)
        rooms = []
        truncated = np.zeros(len(queries), dtype=bool)
        for i, (q, p) in enumerate(zip(query_tokens, passage_tokens, strict=True)):
            rooms.append(self.max_tokens - self._special - len(q.ids))
            truncated[i] = len(p.ids) > rooms[-1]
        if self.window == "overlap":
            passage_tokens = self._windows(query_tokens, passage_tokens, passages, rooms, truncated)
        encodings = []
        for q, p, room in zip(query_tokens, passage_tokens, rooms, strict=True):
            p.truncate(room)
            encodings.append(self.tokenizer.post_process(q, p, add_special_tokens=True))
        return encodings, truncated

    def _windows(
        self,
        query_tokens: Sequence[Encoding],
        passage_tokens: Sequence[Encoding],
        passages: Sequence[str],
        rooms: Sequence[int],
        truncated: np.ndarray,
    ) -> list[Encoding]:
        """Each cut passage rebuilt as its opening plus its best-matching span (the text between
        them left out), tokenised again so the tokenizer's own rules hold at the seam."""
        out, spliced, texts = list(passage_tokens), [], []
        for i in np.flatnonzero(truncated).tolist():
            p, room = passage_tokens[i], rooms[i]
            head = min(self.window_head_tokens, room // 2)
            wanted = content_ids(self.tokenizer, query_tokens[i].ids)
            start = best_start(p.ids, wanted, room - head, after=head)
            start = word_start(self.tokenizer, p.ids, start, floor=head)
            if start == head:
                continue  # the best span follows the opening: the head is the window
            end = min(start + room - head, len(p.ids)) - 1
            opening = passages[i][: p.offsets[head - 1][1]] if head else ""
            texts.append(f"{opening} {passages[i][p.offsets[start][0] : p.offsets[end][1]]}".strip())
            spliced.append(i)
        for i, encoding in zip(
            spliced, self.tokenizer.encode_batch(texts, add_special_tokens=False), strict=True
        ):
            out[i] = encoding
        return out

    def _run(self, encodings: Sequence[Encoding]) -> np.ndarray:
        length = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), length), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            ids[row, :n] = encoding.ids
            mask[row, :n] = encoding.attention_mask
            types[row, :n] = encoding.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = types
        logits = np.asarray(self.session.run([self._output], feeds)[0], dtype=np.float32)
        raw = (
            logits[:, 1] - logits[:, 0]
            if self.head == TWO_CLASS
            else logits.reshape(len(encodings), -1)[:, 0]
        )
        return (self.manifest.score_scale * raw + self.manifest.score_bias).astype(np.float32)


def _load_tokenizer(path: Path) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read tokenizer {path}: {exc}") from exc
    # Shipped tokenizer.json files often pad and truncate on their own: pairs are sized here.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _load_session(path: Path, provider: str, threads: int, spinning: bool) -> ort.InferenceSession:
    options = session_options(threads, spinning)
    try:
        providers = choose_providers(provider, ort.get_available_providers(), "reranker_provider")
    except ProviderUnavailable as exc:
        raise ModelLoadError(str(exc)) from exc
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:
        raise ModelLoadError(f"cannot load ONNX model {path}: {exc}") from exc
