"""The per-job package environment: pip options from index URLs, pip's own error lines."""

from __future__ import annotations

import pytest

from trainjob.backends.local.supervisor.environment import index_options, pip_error


@pytest.mark.parametrize(
    ("urls", "options"),
    [
        (None, []),
        (["https://pypi.org/simple"], []),
        (["https://mirror/simple", "https://extra/simple"], ["--index-url", "https://mirror/simple", "--extra-index-url", "https://extra/simple"]),
    ],
)
def test_pip_index_urls_become_pip_options(urls, options):
    assert index_options(urls) == options


def test_pip_errors_are_reported_in_pips_words():
    output = "Looking in links: /x\nERROR: Could not find a version that satisfies the requirement nope\nERROR: No matching distribution found for nope\n"
    assert pip_error(output) == (
        "ERROR: Could not find a version that satisfies the requirement nope ERROR: No matching distribution found for nope"
    )
