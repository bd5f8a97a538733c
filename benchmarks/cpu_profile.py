"""Sample a running process with py-spy (a sampling profiler: no change to the process) and name its top frames.

``benchmarks/reconcile.py --kwok --profile DIR`` samples the operator while it works; by hand::

    with Sampling(pid, Path("/tmp/operator.txt")):   # py-spy record --format raw (collapsed stacks)
        ...                                            # the work to profile
    print(top_frames(Path("/tmp/operator.txt")))      # the functions with the most samples, self and inclusive

    python benchmarks/cpu_profile.py /tmp/operator.txt    # the same summary of a file written before

A raw file is one stack per line (``frame;frame;... count``, outermost first) and loads into flame graph tools
(``flamegraph.pl``, speedscope). ``py-spy`` comes with the dev requirements.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

#: Samples per second (py-spy's default, 100, costs the sampled process nothing with --nonblocking).
RATE = 100


class Sampling:
    """``py-spy record`` of process ``pid`` into ``out`` while the ``with`` block runs."""

    def __init__(self, pid: int, out: Path, rate: int = RATE) -> None:
        self.pid, self.out, self.rate = pid, out, rate
        self.popen: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Sampling:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.popen = subprocess.Popen(
            [spy, "record", "--format", "raw", "--nonblocking", f"--rate={self.rate}", f"--pid={self.pid}",
             f"--output={self.out}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        try:
            _, err = self.popen.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            _, err = self.popen.communicate()
        if not self.out.exists():
            print(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}", file=sys.stderr)


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _function(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py)``: one name per function, whichever line sampled."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["file"]
    for marker in ("site-packages/", "/src/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{match['func']} ({path})"


#: Leaf frames of a thread that waits (py-spy without ``--native`` cannot tell all of them from work).
_WAITING = ("EpollSelector.select (", "_worker (concurrent/futures/thread.py)", "Condition.wait (", "Event.wait (",
            "_wait_for_tstate_lock (", "Thread.join (")


def top_frames(path: Path, count: int = 15) -> str:
    """The ``count`` functions with the most samples in a raw py-spy file: where the process spent its own time
    (self) and what it spent it under (inclusive), each as a share of the samples of threads at work (waiting in
    the event loop's ``select`` or on a thread pool's queue left out)."""
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        n = int(samples)
        frames = [_function(f) for f in stack.split(";")]
        if frames[-1].startswith(_WAITING):
            continue
        total += n
        own[frames[-1]] += n
        for name in set(frames):
            under[name] += n
    if not total:
        return f"{path}: no samples"
    lines = [f"{path.name}: {total} samples of threads at work ({total / RATE:.1f} s at {RATE}/s)", "  self:"]
    lines += [f"    {n / total:6.1%}  {name}" for name, n in own.most_common(count)]
    lines.append("  inclusive (below the event loop and the threads' entry points):")
    plumbing = ("(asyncio/", "(click/", "(threading.py)", "(concurrent/", "(trainjob/cli/", "<module>", "(runpy.py)",
                "(<frozen runpy>)", "run_operator (", "operate (", "serve (", "run (trainjob/backends/kubernetes/watch")
    shown = [(name, n) for name, n in under.most_common() if not any(e in name for e in plumbing)]
    lines += [f"    {n / total:6.1%}  {name}" for name, n in shown[:count]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="+", type=Path, help="raw py-spy files (py-spy record --format raw)")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    for path in args.profiles:
        print(top_frames(path, args.top))


if __name__ == "__main__":
    main()
