"""ONNX Runtime execution providers, shared by the services that run models (embedder, reranker):
CUDA when onnxruntime-gpu offers it and the operator allows it, the CPU otherwise."""

from __future__ import annotations

from collections.abc import Sequence

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


class ProviderUnavailable(RuntimeError):
    """CUDA was required but this ONNX Runtime cannot give it."""


def choose_providers(requested: str, available: Sequence[str], setting: str) -> list[str]:
    """Providers in priority order for ``requested`` (auto, cpu or cuda); ``setting`` names the
    operator's knob in the error."""
    if requested == "cpu":
        return [CPU_PROVIDER]
    if CUDA_PROVIDER in available:
        return [CUDA_PROVIDER, CPU_PROVIDER]
    if requested == "cuda":
        raise ProviderUnavailable(
            f"{setting}=cuda but ONNX Runtime offers only {list(available)} "
            "(install onnxruntime-gpu on a machine with CUDA)"
        )
    return [CPU_PROVIDER]
