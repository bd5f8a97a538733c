#!/usr/bin/env bash
# One-shot GPU measurement run: bash benchmarks/gpu/run.sh [--dry-run] [--steps a,b] [--out DIR]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-python}"
export OUT="${OUT:-$(mktemp -d -t gpu-bench-XXXXXX)}"
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
if [ -d "$HERE/wheels" ] && compgen -G "$HERE/wheels/*.whl" >/dev/null; then
  TARGET="$(mktemp -d -t gpu-bench-wheels-XXXXXX)"
  "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$TARGET" "$HERE"/wheels/*.whl
  export PYTHONPATH="$PYTHONPATH:$TARGET"
fi
exec "$PYTHON" "$HERE/run.py" --out "$OUT" "$@"
