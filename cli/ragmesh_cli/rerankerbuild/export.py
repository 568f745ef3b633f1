"""Export the trained cross-encoder to an ONNX model directory: fp32 graph, int8 dynamic
quantisation, the tokenizer, and a manifest with sha256s and the score semantics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshkit.domain.ids import sha256_file

if TYPE_CHECKING:
    from ragmesh_cli.rerankerbuild.bert import CrossEncoder

MANIFEST = "manifest.json"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def export_fp32(model: CrossEncoder, path: Path) -> None:
    import torch  # only the build has it; write_manifest serves benchmarks without it

    model.eval()
    sample = torch.ones((2, 16), dtype=torch.long)
    dynamic = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
    dynamic["logits"] = {0: "batch"}
    with torch.inference_mode():
        torch.onnx.export(
            model,
            (sample, sample, torch.zeros_like(sample)),
            str(path),
            input_names=list(INPUTS),
            output_names=["logits"],
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )


def quantize_int8(source: Path, target: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Weights to signed int8 per channel, activations quantised on the fly: the usual recipe for
    # BERT-sized models on CPU (the reference ms-marco cross-encoder ships the same way).
    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True)


def write_manifest(model_dir: Path, fields: dict[str, Any]) -> dict[str, Any]:
    files = {
        name: sha256_file(model_dir / name)
        for name in ("model.onnx", "tokenizer.json")
        if (model_dir / name).is_file()
    }
    manifest = {**fields, "files": files}
    (model_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def copy_tokenizer(tokenizer_path: Path, model_dir: Path) -> None:
    shutil.copyfile(tokenizer_path, model_dir / "tokenizer.json")
