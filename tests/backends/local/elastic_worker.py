"""A tiny elastic training run (linear regression, DDP over gloo) for the shrink and grow tests.

``python elastic_worker.py STEPS CHECKPOINT_EVERY BATCH [LR_SCALING]``, under torchrun or as one process. Every
rank appends what it saw at each start (restart count, rank, world size, resumed step) to ``rounds.jsonl`` in
``$ELASTIC_OUT``, else the job's directory (or the current one); rank 0 reports a loss per step (the learning rate decays linearly to 0) and writes the final loss on the whole
data set to ``final.json``.
"""

import json
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import trainjob.torch as tt

STEPS, EVERY, BATCH = (int(arg) for arg in sys.argv[1:4])
SCALING = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "none" else None
STEP_SECONDS = float(os.environ.get("ELASTIC_STEP_SECONDS", "0.15"))
OUT = os.environ.get("ELASTIC_OUT") or os.environ.get("TRAINJOB_JOB_DIR", os.getcwd())

ctx = tt.init()
generator = torch.Generator().manual_seed(1)
features = torch.randn(960, 8, generator=generator)
target = features @ torch.arange(1.0, 9.0) + 0.1 * torch.randn(960, generator=generator)
dataset = TensorDataset(features, target)

tt.seed_everything(0)
model = tt.prepare_model(nn.Linear(8, 1), "ddp")
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
# Decays to nothing at the last step, so the final loss is the data's noise floor whatever path training took.
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: max(0.0, 1 - done / STEPS))
loader = tt.prepare_data_loader(DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True))
ckpt = tt.Checkpointer(os.path.join(OUT, "ckpt"), keep_last=2, elastic=tt.ElasticConfig(lr_scaling=SCALING))
step = ckpt.resume(model, optimizer, loader=loader, scheduler=scheduler)
with open(os.path.join(OUT, "rounds.jsonl"), "a") as f:
    f.write(json.dumps({"restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), "rank": ctx.rank,
                        "world_size": ctx.world_size, "step": step, "base_lr": scheduler.base_lrs[0],
                        "time": time.time()}) + "\n")
while step < STEPS:
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        tt.report({"loss": loss.item(), "world_size": ctx.world_size}, step=step, total_steps=STEPS)
        time.sleep(STEP_SECONDS)
        if step % EVERY == 0:
            ckpt.save(step, model, optimizer, loader=loader, scheduler=scheduler)
        if step == STEPS:
            break
if ctx.is_main:
    with torch.no_grad():
        final = nn.functional.mse_loss(model(features).squeeze(-1), target).item()
    with open(os.path.join(OUT, "final.json"), "w") as f:
        json.dump({"loss": final, "step": step}, f)
tt.shutdown()
