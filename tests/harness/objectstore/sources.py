"""Small sources for the initializers' tests: a model folder and a dataset folder as a Hub repo or an S3 prefix
holds them (written here, random weights)."""

from __future__ import annotations

import random
from pathlib import Path


def tiny_model(folder: Path, weights: int = 300_000, with_bin: bool = False) -> Path:
    """``config.json``, ``model.safetensors`` (``weights`` random bytes), ``tokenizer.json``; ``with_bin``: also a
    ``pytorch_model.bin``, which a model's default ignore patterns leave out."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "tiny", "hidden_size": 8}\n')
    (folder / "model.safetensors").write_bytes(random.Random(1).randbytes(weights))
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"vocab": {"a": 0, "b": 1}}}\n')
    if with_bin:
        (folder / "pytorch_model.bin").write_bytes(random.Random(2).randbytes(20_000))
    return folder


def tiny_dataset(folder: Path, rows: int = 100) -> Path:
    """``data/train.jsonl`` of ``rows`` lines and a ``README.md`` card."""
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "train.jsonl").write_text("".join(f'{{"text": "row {i}"}}\n' for i in range(rows)))
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# tiny data\n")
    return folder
