"""The examples in the docstrings of trainjob.api and trainjob.runtime run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import trainjob.api
import trainjob.runtime

MODULES = sorted(
    info.name
    for package in (trainjob.api, trainjob.runtime)
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
)


@pytest.mark.parametrize("name", [trainjob.api.__name__, trainjob.runtime.__name__, *MODULES])
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
