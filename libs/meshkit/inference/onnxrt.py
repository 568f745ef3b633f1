"""ONNX Runtime settings shared by the services that run models (embedder, reranker): execution
providers (CUDA when onnxruntime-gpu offers it and the operator allows it, the CPU otherwise)
and session options."""

from __future__ import annotations

from collections.abc import Sequence

import onnxruntime as ort

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


def session_options(threads: int, spinning: bool) -> ort.SessionOptions:
    """Fully optimised graphs; ``threads`` intra-op threads (0: ONNX Runtime's default, one per
    core). ``spinning`` lets idle intra-op threads busy-wait for the next op. That shaves a little
    latency on a machine the model has to itself, but where services share cores the spinning
    takes the CPU the others need: on two cores it doubled the embedder's CPU per search, at the
    same latency (docs/BENCHMARKS.md)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads > 0:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return options
