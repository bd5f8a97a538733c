#!/usr/bin/env bash
# Sets up the environment and runs the main job: 2 nodes x 2 processes of DDP training on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/trainjob run examples/digits_ddp.py --nodes 2 --nproc-per-node 2 "$@"
