"""Hold one set of benchmark figures against another: the ratio of every figure the two JSON files share.

``benchmarks/launch.py``, ``benchmarks/listing.py`` and ``benchmarks/recovery.py`` write their figures with
``--json PATH``; keep the previous release's files and compare a change against them in one command::

    python benchmarks/compare.py release.json change.json
    python benchmarks/compare.py release.json change.json --max-ratio 1.05    # exit 1 if a time grew more

Figures are the numbers of nested objects, named by their path (``launch.trainjob_run_s``); lists (each run's
own figures) are left out. A ratio below 1 means the second file's figure is smaller: for times (``..._s``) and
ratios against a baseline, that is faster. ``--max-ratio`` checks the times only, since the other figures
(counts, ratios measured in the same run) already carry their own baseline.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def report(results: dict[str, Any], path: Path | None) -> None:
    """Print a benchmark's figures as JSON and, with ``path`` (its ``--json``), write them there for this script."""
    text = json.dumps(results, indent=2)
    print(text)
    if path:
        path.write_text(text + "\n")


def figures(data: Any, prefix: str = "") -> dict[str, float]:
    """The numbers in ``data`` by dotted path; booleans and lists are not figures."""
    found: dict[str, float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            found.update(figures(value, f"{prefix}{key}."))
    elif isinstance(data, int | float) and not isinstance(data, bool):
        found[prefix.rstrip(".")] = float(data)
    return found


def compare(before: dict[str, float], after: dict[str, float]) -> list[tuple[str, float, float, float | None]]:
    """``(name, before, after, after / before)`` for every figure in both, in the first file's order; the ratio
    is ``None`` when the first figure is 0."""
    rows = []
    for name, old in before.items():
        if name in after:
            new = after[name]
            rows.append((name, old, new, new / old if old else None))
    return rows


def is_time(name: str) -> bool:
    return name.endswith("_s")


def render(rows: list[tuple[str, float, float, float | None]], before: str, after: str) -> str:
    """A table: each figure, its value in each file (headed by the file's name) and their ratio."""
    width = max([len("figure"), *(len(name) for name, *_ in rows)])
    column = max(12, len(before), len(after))
    lines = [f"{'figure':<{width}}  {before:>{column}}  {after:>{column}}  {'ratio':>7}"]
    for name, old, new, ratio in rows:
        shown = "-" if ratio is None else f"{ratio:.2f}x"
        lines.append(f"{name:<{width}}  {old:>{column}.4g}  {new:>{column}.4g}  {shown:>7}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="figures to compare against (e.g. the previous release's)")
    parser.add_argument("after", type=Path, help="figures of the change")
    parser.add_argument("--max-ratio", type=float, metavar="R",
                        help="exit 1 when a time (a figure ending in _s) is more than R times the first file's")
    args = parser.parse_args(argv)
    before = figures(json.loads(args.before.read_text()))
    after = figures(json.loads(args.after.read_text()))
    rows = compare(before, after)
    if not rows:
        print(f"no figures in common between {args.before} and {args.after}", file=sys.stderr)
        return 2
    print(render(rows, args.before.name, args.after.name))
    if args.max_ratio is None:
        return 0
    worse = [(name, ratio) for name, _, _, ratio in rows
             if is_time(name) and ratio is not None and math.isfinite(ratio) and ratio > args.max_ratio]
    for name, ratio in worse:
        print(f"{name}: {ratio:.2f}x, more than {args.max_ratio:g}x", file=sys.stderr)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
