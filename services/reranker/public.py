"""What other code may use of the reranker (it imports this module only, never the servicer or
its internals): the ONNX cross-encoder the service serves, loaded in-process, for tools that
score pairs without the service (the reranker build's calibration and validation, benchmarks);
and its rule for which scored passages a Rerank call returns (threshold, fallback), for fakes
and tools that must choose like it."""

from __future__ import annotations

from services.reranker.model import CrossEncoderModel
from services.reranker.selection import Selection, select

__all__ = ["CrossEncoderModel", "Selection", "select"]
