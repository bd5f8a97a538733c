"""A Ray Train driver whose train_func raises on every attempt; Ray restarts it once (max_failures=1).

Each attempt appends a line to the file named by the first argument, so a test can count Ray's attempts."""

import sys

from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

ATTEMPTS = sys.argv[1]


def train_func():
    import ray.train

    if ray.train.get_context().get_world_rank() == 0:
        with open(ATTEMPTS, "a") as f:
            f.write("attempt\n")
    raise ValueError("the loss went to 42")


TorchTrainer(
    train_func,
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    run_config=RunConfig(storage_path=sys.argv[2], failure_config=FailureConfig(max_failures=1)),
).fit()
