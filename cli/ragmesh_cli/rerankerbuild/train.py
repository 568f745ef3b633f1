"""Listwise fine-tuning: each step reads groups of one positive and hard negatives, and a softmax
over the group's logits pushes the positive up. Deterministic given the seed (and thread count):
sampling uses seeded generators, torch runs with deterministic algorithms."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from ragmesh_cli.rerankerbuild.bert import CrossEncoder
from ragmesh_cli.rerankerbuild.mining import Mined, Passage, progress
from ragmesh_cli.rerankerbuild.validation import Scorer


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 13
    groups: int = 1800
    negatives: int = 5
    groups_per_step: int = 2
    learning_rate: float = 5e-5
    # The relevance head starts from random weights: at the encoder's rate it barely moves in the
    # few hundred steps a CPU build affords (the loss sat at ln(6) for 100 steps), so it learns faster.
    head_lr_scale: float = 20.0
    warmup_share: float = 0.1
    weight_decay: float = 0.01
    max_tokens: int = 160
    max_query_tokens: int = 64
    # Negatives come from the top of each leg's list (deeper ones are too easy to teach much).
    negative_depth: int = 20
    # Share of groups drawn from the self-supervised cloze set.
    cloze_share: float = 0.3
    eval_every: int = 400


@dataclass
class Curve:
    points: list[dict[str, float]] = field(default_factory=list)

    def add(self, **values: float) -> None:
        self.points.append(values)


class PairEncoder:
    """Tokenises (query, passage) pairs for BERT: the query is kept whole (up to its own cap), the
    passage is cut to fill the rest."""

    def __init__(self, tokenizer_path: Path, max_tokens: int, max_query_tokens: int) -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_tokens = max_tokens
        self.max_query_tokens = max_query_tokens
        cls, sep = self.tokenizer.token_to_id("[CLS]"), self.tokenizer.token_to_id("[SEP]")
        if cls is None or sep is None:
            raise ValueError(f"{tokenizer_path} has no [CLS]/[SEP]: not a BERT tokenizer")
        self.cls, self.sep = cls, sep

    def encode(self, queries: Sequence[str], passages: Sequence[str]) -> dict[str, torch.Tensor]:
        query_ids = self.tokenizer.encode_batch(list(queries), add_special_tokens=False)
        passage_ids = self.tokenizer.encode_batch(list(passages), add_special_tokens=False)
        rows = []
        for q, p in zip(query_ids, passage_ids, strict=True):
            q_ids = q.ids[: self.max_query_tokens]
            room = self.max_tokens - len(q_ids) - 3
            rows.append(([self.cls, *q_ids, self.sep], [*p.ids[:room], self.sep]))
        length = max(len(a) + len(b) for a, b in rows)
        ids = np.zeros((len(rows), length), dtype=np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        for r, (a, b) in enumerate(rows):
            ids[r, : len(a) + len(b)] = a + b
            mask[r, : len(a) + len(b)] = 1
            types[r, len(a) : len(a) + len(b)] = 1
        return {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(mask),
            "token_type_ids": torch.from_numpy(types),
        }


def negative_pool(item: Mined, passages: Sequence[Passage], depth: int) -> list[int]:
    """Both legs' top candidates outside the positives' documents, one passage per document,
    interleaved so each leg contributes equally."""
    gold = set(item.positive_docs)
    pool: list[int] = []
    seen: set[str] = set()
    for pair in zip(item.bm25[:depth], item.dense[:depth], strict=False):
        for index in pair:
            doc = passages[index].doc_id
            if doc not in gold and doc not in seen:
                seen.add(doc)
                pool.append(index)
    return pool


def schedule(config: TrainConfig, fit: Sequence[Mined], cloze: Sequence[Mined]) -> list[tuple[Mined, int]]:
    """The (group, positive) pairs of the whole run, in order: epochs over the claims' positives,
    cloze groups mixed in at their share, all shuffled by the seed."""
    rng = random.Random(config.seed)
    claim_pairs = [(item, p) for item in fit for p in item.positives]
    cloze_pairs = [(item, item.positives[0]) for item in cloze]
    wanted_cloze = int(config.groups * config.cloze_share) if cloze_pairs else 0
    out: list[tuple[Mined, int]] = []
    while len(out) < config.groups - wanted_cloze:
        epoch = list(claim_pairs)
        rng.shuffle(epoch)
        out.extend(epoch)
    out = out[: config.groups - wanted_cloze]
    cloze_order = list(cloze_pairs)
    rng.shuffle(cloze_order)
    out.extend((cloze_order * (1 + wanted_cloze // max(len(cloze_order), 1)))[:wanted_cloze])
    rng.shuffle(out)
    return out


def lr_at(step: int, total: int, config: TrainConfig) -> float:
    warmup = max(1, int(total * config.warmup_share))
    if step < warmup:
        return config.learning_rate * (step + 1) / warmup
    return config.learning_rate * max(0.0, (total - step) / max(1, total - warmup))


def parameter_groups(model: CrossEncoder, config: TrainConfig) -> list[dict[str, object]]:
    """Weight decay on matrices only (not biases or LayerNorm); a faster rate for the new head."""
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        groups.setdefault((name.startswith("head."), parameter.ndim > 1), []).append(parameter)
    return [
        {
            "params": params,
            "weight_decay": config.weight_decay if decays else 0.0,
            "lr_scale": config.head_lr_scale if head else 1.0,
        }
        for (head, decays), params in sorted(groups.items())
    ]


def torch_scorer(model: CrossEncoder, encoder: PairEncoder, batch: int = 32) -> Scorer:
    def score(queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        model.eval()
        out = []
        with torch.inference_mode():
            for start in range(0, len(queries), batch):
                feeds = encoder.encode(queries[start : start + batch], passages[start : start + batch])
                out.append(model(**feeds)[:, 0].numpy())
        model.train()
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    return score


def train(
    model: CrossEncoder,
    encoder: PairEncoder,
    passages: Sequence[Passage],
    fit: Sequence[Mined],
    cloze: Sequence[Mined],
    config: TrainConfig,
    evaluate: Callable[[Scorer], dict[str, float]],
    checkpoint: Path | None = None,
) -> Curve:
    torch.manual_seed(config.seed)
    torch.use_deterministic_algorithms(True)
    rng = random.Random(config.seed + 7)
    plan = schedule(config, fit, cloze)
    steps = math.ceil(len(plan) / config.groups_per_step)
    optimizer = torch.optim.AdamW(parameter_groups(model, config), lr=config.learning_rate)
    curve = Curve()
    model.train()
    started = time.monotonic()
    running: list[float] = []
    done_groups = 0
    for step in range(steps):
        chunk = plan[step * config.groups_per_step : (step + 1) * config.groups_per_step]
        queries, texts = [], []
        for item, positive in chunk:
            pool = negative_pool(item, passages, config.negative_depth)
            negatives = rng.sample(pool, min(config.negatives, len(pool)))
            # Short pools are padded by repeating: every group has the same size.
            while len(negatives) < config.negatives and pool:
                negatives.append(rng.choice(pool))
            for index in [positive, *negatives]:
                queries.append(item.query)
                texts.append(passages[index].text)
        logits = model(**encoder.encode(queries, texts))[:, 0].view(len(chunk), config.negatives + 1)
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(len(chunk), dtype=torch.long))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, config) * group["lr_scale"]
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running.append(loss.item())
        before, done_groups = done_groups, done_groups + len(chunk)
        if done_groups // 50 != before // 50:
            elapsed = time.monotonic() - started
            eta = elapsed / done_groups * (len(plan) - done_groups) / 60
            progress(
                f"train: {done_groups}/{len(plan)} groups, loss {np.mean(running[-25:]):.3f}, "
                f"{elapsed / 60:.1f} min, eta {eta:.1f} min"
            )
        if done_groups // config.eval_every != before // config.eval_every or step == steps - 1:
            metrics = evaluate(torch_scorer(model, encoder))
            curve.add(groups=done_groups, loss=float(np.mean(running[-50:])), **metrics)
            progress(f"validation at {done_groups} groups: {metrics}")
            if checkpoint is not None:
                torch.save(model.state_dict(), checkpoint)
    return curve
