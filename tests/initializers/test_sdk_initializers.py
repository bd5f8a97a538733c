"""trainjob's initializer types against the real Kubeflow SDK (``kubeflow`` 0.5, installed in the venv): the same
constructor arguments and defaults, and the same ``spec.initializer`` for the same fields."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

pytest.importorskip("kubeflow.trainer")

from kubeflow.trainer.backends.kubernetes import utils as kubeflow_utils  # noqa: E402
from kubeflow.trainer.types import types as kubeflow_types  # noqa: E402

from trainjob.errors import ValidationError  # noqa: E402
from trainjob.sdk import initializers as trainjob_types  # noqa: E402
from trainjob.sdk.initializers import initializer_spec  # noqa: E402

DATASETS = ("HuggingFaceDatasetInitializer", "S3DatasetInitializer")
MODELS = ("HuggingFaceModelInitializer", "S3ModelInitializer")
S3_FIELDS = {"endpoint": "http://minio:9000", "access_key_id": "AK", "secret_access_key": "SK",
             "region": "eu-west-1", "role_arn": "arn:aws:iam::123:role/reader"}

CASES = [
    ("HuggingFaceDatasetInitializer", {"storage_uri": "hf://tatsu-lab/alpaca"}),
    ("HuggingFaceDatasetInitializer", {"storage_uri": "hf://tatsu-lab/alpaca@v1", "access_token": "hf_x"}),
    ("HuggingFaceDatasetInitializer", {"storage_uri": "hf://org/data/train.json", "ignore_patterns": ["*.md", "x/*"],
                                       "access_token": "hf_x"}),
    ("S3DatasetInitializer", {"storage_uri": "s3://bucket/data/train"}),
    ("S3DatasetInitializer", {"storage_uri": "s3://bucket", "endpoint": "http://minio:9000"}),
    ("S3DatasetInitializer", {"storage_uri": "s3://bucket/p", "ignore_patterns": ["*.tmp"], **S3_FIELDS}),
    ("HuggingFaceModelInitializer", {"storage_uri": "hf://Qwen/Qwen2.5-0.5B"}),  # Kubeflow's default ignores
    ("HuggingFaceModelInitializer", {"storage_uri": "hf://org/tiny", "ignore_patterns": None}),
    ("HuggingFaceModelInitializer", {"storage_uri": "hf://org/tiny", "ignore_patterns": []}),
    ("HuggingFaceModelInitializer", {"storage_uri": "hf://org/tiny@main", "ignore_patterns": ["*.onnx"],
                                     "access_token": "hf_x"}),
    ("S3ModelInitializer", {"storage_uri": "s3://models/tiny"}),
    ("S3ModelInitializer", {"storage_uri": "s3://models/tiny/", "ignore_patterns": None, **S3_FIELDS}),
    ("S3ModelInitializer", {"storage_uri": "s3://models/tiny", "ignore_patterns": ["*.bin"], "region": "us-east-1"}),
]


def kubeflow_spec(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """What the Kubeflow SDK puts in ``spec.initializer.dataset`` / ``.model`` for these fields. It writes ``env:
    []`` when no field is set; Kubernetes drops an empty list (``omitempty``), and trainjob leaves it out."""
    value = getattr(kubeflow_types, name)(**fields)
    build = kubeflow_utils.get_dataset_initializer if name in DATASETS else kubeflow_utils.get_model_initializer
    spec = build(value).to_dict()
    if spec.get("env") == []:
        del spec["env"]
    return spec


def slot(name: str) -> str:
    return "dataset" if name in DATASETS else "model"


@pytest.mark.parametrize(("name", "fields"), CASES, ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_the_spec_is_what_the_kubeflow_sdk_builds(name: str, fields: dict[str, Any]) -> None:
    ours = getattr(trainjob_types, name)(**fields)
    spec = initializer_spec(trainjob_types.Initializer(**{slot(name): ours}))
    assert spec == {slot(name): kubeflow_spec(name, fields)}


@pytest.mark.parametrize(("name", "fields"), CASES, ids=lambda v: v if isinstance(v, str) else ",".join(v))
def test_the_kubeflow_sdks_own_objects_give_the_same_spec(name: str, fields: dict[str, Any]) -> None:
    theirs = getattr(kubeflow_types, name)(**fields)
    spec = initializer_spec(kubeflow_types.Initializer(**{slot(name): theirs}))
    assert spec == {slot(name): kubeflow_spec(name, fields)}


def test_a_dataset_and_a_model_together() -> None:
    dataset = {"storage_uri": "s3://data/train", "endpoint": "http://minio:9000"}
    model = {"storage_uri": "hf://org/tiny", "access_token": "hf_x"}
    spec = initializer_spec(trainjob_types.Initializer(
        dataset=trainjob_types.S3DatasetInitializer(**dataset),
        model=trainjob_types.HuggingFaceModelInitializer(**model)))
    assert spec == {"dataset": kubeflow_spec("S3DatasetInitializer", dataset),
                    "model": kubeflow_spec("HuggingFaceModelInitializer", model)}


def test_no_initializer_gives_no_spec() -> None:
    assert initializer_spec(None) is None
    assert initializer_spec(trainjob_types.Initializer()) is None


@pytest.mark.parametrize("types", [trainjob_types, kubeflow_types], ids=["trainjob", "kubeflow"])
def test_the_data_cache_initializer_is_refused_naming_the_field(types: Any) -> None:
    cache = types.DataCacheInitializer(storage_uri="cache://schema/table", metadata_loc="s3://meta/x.json",
                                       num_data_nodes=2)
    with pytest.raises(ValidationError) as refused:
        initializer_spec(types.Initializer(dataset=cache))
    assert refused.value.path == "initializer.dataset"
    assert str(refused.value).startswith("initializer.dataset: DataCacheInitializer")


def test_a_model_type_in_the_dataset_slot_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        initializer_spec(trainjob_types.Initializer(dataset=trainjob_types.S3ModelInitializer(storage_uri="s3://b")))  # type: ignore[arg-type]
    assert refused.value.path == "initializer.dataset"


@pytest.mark.parametrize("name", [*DATASETS, *MODELS, "DataCacheInitializer", "BaseInitializer"])
def test_the_types_take_the_same_arguments_with_the_same_defaults(name: str) -> None:
    ours, theirs = getattr(trainjob_types, name), getattr(kubeflow_types, name)
    assert describe(ours) == describe(theirs)
    assert typing.get_type_hints(ours) == typing.get_type_hints(theirs)


def test_initializer_has_the_same_slots() -> None:
    assert describe(trainjob_types.Initializer) == describe(kubeflow_types.Initializer)


def describe(cls: type) -> list[tuple[str, object, object]]:
    """Each field: name, default, and what its default factory makes (``MISSING`` where there is none)."""
    return [(f.name, f.default, f.default_factory() if f.default_factory is not dataclasses.MISSING
             else dataclasses.MISSING) for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("name", ["S3DatasetInitializer", "S3ModelInitializer"])
def test_an_s3_type_refuses_another_scheme_as_kubeflows_does(name: str) -> None:
    with pytest.raises(ValueError) as ours:
        getattr(trainjob_types, name)(storage_uri="gs://bucket/x")
    with pytest.raises(ValueError) as theirs:
        getattr(kubeflow_types, name)(storage_uri="gs://bucket/x")
    assert str(ours.value) == str(theirs.value)


def test_a_bare_hub_name_gets_the_hf_scheme() -> None:
    """Beyond Kubeflow: its SDK writes ``org/data`` as is (only its TorchTune args add ``hf://``); trainjob adds
    the scheme, so this one case is left out of the parity cases above."""
    value = trainjob_types.HuggingFaceDatasetInitializer(storage_uri="org/data")
    assert initializer_spec(trainjob_types.Initializer(dataset=value)) == {"dataset": {"storageUri": "hf://org/data"}}
