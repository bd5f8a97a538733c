"""The calls shown in the tools' docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "trainjob.units",
    "trainjob.tools.training_setup",
    "trainjob.tools.comm",
    "trainjob.tools.sizing.memory",
    "trainjob.tools.sizing.communication",
    "trainjob.tools.sizing.report",
    "trainjob.tools.checker",
    "trainjob.tools.megatron",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
