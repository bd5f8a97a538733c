"""parallelize's default loss belongs to the parallel package, not to the GPT example model."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import torch

from trainjob.torch.parallel import compose, gpt, loss, parallelize, pipeline

PARALLEL = Path(compose.__file__).parent


def test_the_default_loss_is_the_parallel_package_lm_loss() -> None:
    default = inspect.signature(parallelize).parameters["loss_fn"].default
    assert default is loss.lm_loss
    assert default.__module__ == "trainjob.torch.parallel.loss"
    assert gpt.lm_loss is loss.lm_loss  # the example trains with the same loss


def test_no_library_module_of_the_parallel_package_imports_the_gpt_example() -> None:
    importers = []
    for path in PARALLEL.glob("*.py"):
        if path.name == "gpt.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("parallel.gpt"):
                importers.append(path.name)
    assert importers == []
    assert pipeline.LossFn is loss.LossFn


def test_lm_loss_is_mean_next_token_cross_entropy_in_float32() -> None:
    logits = torch.zeros(2, 3, 4, dtype=torch.bfloat16)
    targets = torch.tensor([[0, 1, 2], [3, 0, 1]])
    value = loss.lm_loss(logits, targets)
    assert value.dtype == torch.float32
    assert torch.isclose(value, torch.log(torch.tensor(4.0)))
