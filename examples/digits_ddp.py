"""Data-parallel training of a digit classifier (scikit-learn's 8x8 ``load_digits``) with plain PyTorch DDP.

The classic torchrun script: process group from the environment, ``DistributedSampler`` with ``set_epoch``,
``DistributedDataParallel``, logs and checkpoints on rank 0 only, evaluation reduced over all ranks. It runs the
same under ``trainjob`` and plain ``torchrun``, and picks up from its last checkpoint when restarted::

    trainjob run examples/digits_ddp.py --nodes 2 --nproc-per-node 2
    torchrun --nnodes 1 --nproc-per-node 4 examples/digits_ddp.py -- --epochs 20
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:  # progress for `trainjob get` / `trainjob list`; plain prints when trainjob is not installed
    from trainjob.torch import report
except ImportError:
    report = None


def digits_datasets(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """The 1797 digits as 64 features in [0, 1], split 80/20 the same way on every rank."""
    features, labels = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        features / 16.0, labels, test_size=0.2, random_state=seed, stratify=labels
    )

    def as_dataset(x, y) -> TensorDataset:
        return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long))

    return as_dataset(x_train, y_train), as_dataset(x_test, y_test)


class DigitsNet(nn.Module):
    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader) -> float:
    """Accuracy over the whole test set: each rank counts its shard, the counts are summed over ranks."""
    model.eval()
    counts = torch.zeros(2)
    for x, y in loader:
        counts += torch.tensor([(model(x).argmax(dim=1) == y).sum().item(), len(y)])
    dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item()


def train(args: argparse.Namespace) -> float:
    """Train for ``args.epochs`` (continuing from the last checkpoint) and return the test accuracy."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train_set, test_set = digits_datasets()
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=DistributedSampler(test_set, shuffle=False))
    model = DDP(DigitsNet())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    checkpoint = Path(args.checkpoint_dir) / "checkpoint.pt"
    start_epoch = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    if rank == 0:
        print(f"training on {world_size} processes, epochs {start_epoch}..{args.epochs - 1}", flush=True)

    total_steps = args.epochs * len(train_loader)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        for batch, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            step = epoch * len(train_loader) + batch + 1
            if report is not None and (step % 10 == 0 or step == total_steps):
                report({"loss": loss.item()}, step=step, total_steps=total_steps)
        accuracy = evaluate(model, test_loader)
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} test accuracy {accuracy:.4f}", flush=True)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            state = {"epoch": epoch, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)  # a crash never leaves half a checkpoint

    return evaluate(model, test_loader)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint-dir", default=os.path.join(os.environ.get("TRAINJOB_JOB_DIR", "."), "checkpoints"))
    parser.add_argument("--min-accuracy", type=float, default=0.0, help="exit 1 when the test accuracy is lower")
    args = parser.parse_args()

    dist.init_process_group(backend="gloo")
    accuracy = train(args)
    if dist.get_rank() == 0:
        print(f"final test accuracy {accuracy:.4f}", flush=True)
    # The DDP model is gone with train()'s frame; wait for every rank before tearing the process group down,
    # so no gloo work is still in flight when it is destroyed (that can deadlock at exit on CPU).
    dist.barrier()
    dist.destroy_process_group()
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: on CPU, gloo's background threads can abort the process (SIGABRT) while Python
    # finalizes, after all work is done and saved, which would turn a finished run into a failed one.
    os._exit(code)
