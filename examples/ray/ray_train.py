"""The Ray Train script of the seeds, with its model and dataset filled in: a small regression on generated data.

As written for Ray: it imports no trainjob. Run it under trainjob on 2 nodes (node 0 runs the Ray head and this
driver, node 1 joins with its CPUs; ``train.report``'s metrics become the job's progress)::

    trainjob run --runtime ray-distributed examples/ray/ray_train.py --nodes 2 -- /tmp/ray_results

or with plain Ray on this machine: ``python examples/ray/ray_train.py /tmp/ray_results``. Differences from the
seed: 2 CPU workers instead of 32 GPUs, 5 epochs, a local ``storage_path`` (the first argument) instead of
``s3://my-bucket/ray_results``, and a checkpoint with each report, so ``num_to_keep=3`` has something to keep.
"""

import os
import sys
import tempfile

import ray  # noqa: F401  (as in the seed)
from ray import train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

EPOCHS = int(os.environ.get("EPOCHS", "5"))


class YourModel(__import__("torch").nn.Module):
    """A linear model whose forward pass returns the batch's mean squared error, as the seed's loop expects."""

    def __init__(self):
        import torch

        super().__init__()
        self.linear = torch.nn.Linear(8, 1)

    def forward(self, batch):
        x, y = batch
        return __import__("torch").nn.functional.mse_loss(self.linear(x), y)


def YourDataset():  # noqa: N802  (the seed's name)
    """256 samples of y = x . w + noise, the same on every worker (a fixed generator)."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.1 * torch.randn(256, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def train_func(config):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: F401  (as in the seed)

    torch.manual_seed(0)
    # Ray handles the distributed environment
    model = YourModel()
    model = train.torch.prepare_model(model)  # wraps in DDP

    train_dataset = train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(YourDataset(), batch_size=32)
    )

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-1)

    for epoch in range(EPOCHS):
        for batch in train_dataset:
            loss = model(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        # report the metrics, with a checkpoint (rank 0 writes it)
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                checkpoint = train.Checkpoint.from_directory(folder)
            train.report({"loss": loss.item(), "epoch": epoch}, checkpoint=checkpoint)


# configure the trainer
trainer = TorchTrainer(
    train_func,
    scaling_config=ScalingConfig(
        num_workers=2,  # 2 workers
        use_gpu=False,
    ),
    run_config=RunConfig(
        name="my-training",
        storage_path=os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "ray_results"),
        checkpoint_config=train.CheckpointConfig(
            num_to_keep=3,
            checkpoint_score_attribute="loss",
            checkpoint_score_order="min",
        ),
    ),
)

# start training
result = trainer.fit()
print(f"final loss {result.metrics['loss']:.6f}")
