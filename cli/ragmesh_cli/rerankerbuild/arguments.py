"""``ragmesh models build-reranker``'s arguments, apart from the build (which loads the embedder,
the ingestion chunker and torch) so that building the CLI's parser stays light."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

MODEL_NAME = "ragmesh-minilm-l6-ce-v1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset", type=Path, default=Path("../shared/bench/scifact"), help="BEIR dataset root."
    )
    parser.add_argument(
        "--out", type=Path, default=Path("models/reranker") / MODEL_NAME, help="Model directory."
    )
    parser.add_argument(
        "--work-dir", type=Path, default=Path(".cache/reranker-build"), help="Caches, checkpoints."
    )
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--groups", type=int, default=1800, help="Training groups (1 positive + 5 negatives)."
    )
    parser.add_argument("--cloze", type=int, default=1500, help="Self-supervised cloze groups to mine.")
    parser.add_argument("--train-tokens", type=int, default=160, help="Pair length while training.")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--reuse-checkpoint", action="store_true", help="Skip training when the work dir has the weights."
    )
