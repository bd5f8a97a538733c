"""The bounds every input is held to, so that no input can take unbounded memory or time.

=========================  ==========  ==================================================================
limit                      value       why
=========================  ==========  ==================================================================
:data:`MAX_INPUT_BYTES`    4 MiB       Kubernetes itself stores objects of at most 1.5 MiB
:data:`MAX_DEPTH`          100         a runtime's pod template nests about 15 levels deep
:data:`MAX_NODES`          50,000      a typical runtime has ~100 nodes; a 680-byte "billion laughs"
                                       expands to 387 million
:data:`MAX_EXPANDED_CHARS`  8 MiB      one long string aliased many times
:data:`INT64_RANGE`        64 bits     Kubernetes integers are int64 (Python's would grow without end)
=========================  ==========  ==================================================================

Nodes are scalars, mappings and lists, counted as if every YAML alias (or, in Python data, every shared
object) were a copy. :func:`check_yaml` checks YAML text before anything is built from it (the loader in
:mod:`trainjob.api.io` calls it); :func:`check_data` checks Python data given to ``from_dict``.

>>> check_yaml("a: &x [1, 2]\\nb: [*x, *x]\\n")
>>> check_data([[]] * 10**6)
Traceback (most recent call last):
...
trainjob.errors.ValidationError: holds more than 50,000 values, the limit
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from trainjob.errors import ValidationError

#: Largest input read, in bytes (a file, stdin or text).
MAX_INPUT_BYTES = 4 * 2**20
#: Deepest nesting of mappings and lists, aliases included.
MAX_DEPTH = 100
#: Most nodes in one input once aliases are expanded.
MAX_NODES = 50_000
#: Most characters of scalar text in one input once aliases are expanded.
MAX_EXPANDED_CHARS = 2 * MAX_INPUT_BYTES
#: Smallest and largest integer read.
INT64_RANGE = (-(2**63), 2**63 - 1)

_SURROGATE = re.compile("[\ud800-\udfff]")
_Parser = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where installed: many times faster


class InputRefusedError(ValueError):
    """YAML text past a limit or holding what Kubernetes cannot; ``mark`` (a PyYAML mark, with ``line`` and
    ``column``) is where in the text it was noticed."""

    def __init__(self, message: str, mark: Any = None) -> None:
        super().__init__(message)
        self.mark = mark


def mib(size: int) -> str:
    """``size`` bytes in MiB for a message: ``mib(4 * 2**20)`` -> ``'4 MiB'``."""
    return f"{size / 2**20:.3g} MiB"


@dataclass
class _Collection:
    """A mapping or list being read: its anchor, the counts before it, its level and the deepest inside it."""

    anchor: str | None
    nodes: int
    chars: int
    depth: int
    deepest: int


def check_yaml(text: str) -> None:
    """Raise :class:`InputRefusedError` when ``text`` nests deeper than :data:`MAX_DEPTH`, expands to more than
    :data:`MAX_NODES` nodes or :data:`MAX_EXPANDED_CHARS` characters, holds a recursive or dangling alias, or
    a lone surrogate (``"\\ud800"``, which no output could print). Raises ``yaml.YAMLError`` for text that is
    not YAML.

    Walks the parser's events (a flat stream: deep input cannot exhaust the stack), counts what each alias
    expands to without expanding it, and stops at the first limit, so it takes milliseconds whatever ``text``
    is.
    """
    try:
        _walk_events(yaml.parse(text, Loader=_Parser))
    except yaml.MarkedYAMLError as exc:
        # libyaml (PyYAML >= 6.0.3's wheels) refuses nesting past its own bound (1,000 levels) while scanning
        # ahead, before the event that crosses ours arrives; any depth it refuses is past ours too.
        if "nesting depth" in (exc.problem or ""):
            raise InputRefusedError(f"nests deeper than {MAX_DEPTH} levels, the limit", exc.problem_mark) from None
        raise


def _walk_events(events: Any) -> None:
    nodes = chars = depth = 0
    aliased = False
    anchors: dict[str, tuple[int, int, int]] = {}  # anchor -> (nodes, characters, height) it expands to
    open_: list[_Collection] = []
    for event in events:
        if isinstance(event, yaml.DocumentStartEvent):
            anchors.clear()
        elif isinstance(event, yaml.ScalarEvent):
            nodes += 1
            chars += len(event.value)
            if _SURROGATE.search(event.value):
                raise InputRefusedError("text holds a lone surrogate (\\ud800-\\udfff), not a character", event.start_mark)
            if event.anchor:
                anchors[event.anchor] = (1, len(event.value), 0)
        elif isinstance(event, yaml.CollectionStartEvent):
            nodes += 1
            depth += 1
            open_.append(_Collection(event.anchor, nodes - 1, chars, depth - 1, depth))
        elif isinstance(event, yaml.CollectionEndEvent):
            done = open_.pop()
            depth -= 1
            if open_:
                open_[-1].deepest = max(open_[-1].deepest, done.deepest)
            if done.anchor:
                anchors[done.anchor] = (nodes - done.nodes, chars - done.chars, done.deepest - done.depth)
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor not in anchors:
                recursive = any(o.anchor == event.anchor for o in open_)
                problem = "refers to a node that contains it" if recursive else "refers to no anchor before it"
                raise InputRefusedError(f"alias *{event.anchor[:40]} {problem}", event.start_mark)
            aliased = True
            more_nodes, more_chars, height = anchors[event.anchor]
            nodes += more_nodes
            chars += more_chars
            if open_:
                open_[-1].deepest = max(open_[-1].deepest, depth + height)
            if depth + height > MAX_DEPTH:
                raise InputRefusedError(f"aliases nest deeper than {MAX_DEPTH} levels, the limit", event.start_mark)
        if depth > MAX_DEPTH:
            raise InputRefusedError(f"nests deeper than {MAX_DEPTH} levels, the limit", event.start_mark)
        if nodes > MAX_NODES:
            what = "aliases expand it to" if aliased else "it has"
            raise InputRefusedError(
                f"{what} more than {MAX_NODES:,} nodes, the limit; split it into several files", event.start_mark
            )
        if chars > MAX_EXPANDED_CHARS:
            raise InputRefusedError(
                f"aliases expand its text to more than {mib(MAX_EXPANDED_CHARS)}, the limit", event.start_mark
            )


def check_data(data: Any) -> None:
    """Raise :class:`ValidationError` when ``data`` nests deeper than :data:`MAX_DEPTH` or holds more than
    :data:`MAX_NODES` values; a shared object counts once per place it appears (so a cycle nests too deep).
    Iterative, and stops at the first limit, so it is cheap whatever ``data`` is.

    >>> check_data({"a": [[[[1]]]]})
    """
    count = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ValidationError("", f"holds more than {MAX_NODES:,} values, the limit")
        if not isinstance(value, dict | list | tuple):
            continue
        if depth > MAX_DEPTH:
            raise ValidationError("", f"nests deeper than {MAX_DEPTH} levels, the limit")
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children)
