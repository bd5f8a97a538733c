"""The config file: every key it may hold is read with its kind checked, and a mistake names the file and the key."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.settings import load_config


def write_config(home, text: str):
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.yaml"
    path.write_text(text)
    return path


def test_the_local_queue_settings_are_read_beside_the_backend_ones(trainjob_home):
    path = write_config(trainjob_home, "backend: local\nstrict_resources: true\npriority_classes: {high: 1000, low: -10}\n")

    assert load_config() == ({"backend": "local", "strict_resources": True,
                              "priority_classes": {"high": 1000, "low": -10}}, path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("strict_resources: yes please\n", "strict_resources: must be true or false, got 'yes please'"),
        ("strict_resources: 1\n", "strict_resources: must be true or false, got 1"),
        ("priority_classes: {high: true}\n", "priority_classes: must be a mapping of WorkloadPriorityClass names to "
         "integers"),
        ("namespace: 3\n", "namespace: must be a non-empty string, got 3"),
        ("priority: 3\n", "priority: unknown setting; known: backend, namespace, kubeconfig, context, "
         "strict_resources, priority_classes"),
    ],
)
def test_a_value_of_the_wrong_kind_names_the_file_the_key_and_what_it_must_be(trainjob_home, text, message):
    path = write_config(trainjob_home, text)
    with pytest.raises(ValidationError) as caught:
        load_config()
    assert str(caught.value).startswith(f"{path}: {message}")
