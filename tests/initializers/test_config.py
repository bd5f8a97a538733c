"""Kubeflow's initializer environment read into an :class:`InitializerConfig`, and storage URIs parsed: what each
variable means, the defaults, and the exact message for what is refused. No servers, no processes."""

from __future__ import annotations

import pytest

from trainjob.errors import ValidationError
from trainjob.initializers.config import (
    HF_MODEL_ALLOW_PATTERNS,
    MODEL_IGNORE_PATTERNS,
    InitializerConfig,
    Source,
    parse_storage_uri,
)

KUBEFLOW_MODEL_IGNORE = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")
KUBEFLOW_HF_MODEL_ALLOW = ("*.json", "*.safetensors", "*.model", "*.txt")
ACCEPTED = "hf://<owner>/<name>[@<revision>] or s3://<bucket>[/<prefix>]"


@pytest.mark.parametrize(("uri", "kind", "expected"), [
    ("hf://tatsu-lab/alpaca", "dataset", Source("hf://tatsu-lab/alpaca", "hf", repo_id="tatsu-lab/alpaca")),
    ("hf://tatsu-lab/alpaca@v1.0", "dataset",
     Source("hf://tatsu-lab/alpaca@v1.0", "hf", repo_id="tatsu-lab/alpaca", revision="v1.0")),
    # Kubeflow's dataset initializer keeps <owner>/<name> and drops the path after it
    ("hf://tatsu-lab/alpaca/data/train.json", "dataset",
     Source("hf://tatsu-lab/alpaca/data/train.json", "hf", repo_id="tatsu-lab/alpaca")),
    ("hf://Qwen/Qwen2.5-0.5B", "model", Source("hf://Qwen/Qwen2.5-0.5B", "hf", repo_id="Qwen/Qwen2.5-0.5B")),
    ("hf://Qwen/Qwen2.5-0.5B@" + "a" * 40, "model",
     Source("hf://Qwen/Qwen2.5-0.5B@" + "a" * 40, "hf", repo_id="Qwen/Qwen2.5-0.5B", revision="a" * 40)),
    ("hf://gpt2", "model", Source("hf://gpt2", "hf", repo_id="gpt2")),
    ("hf://gpt2@main", "model", Source("hf://gpt2@main", "hf", repo_id="gpt2", revision="main")),
    ("s3://bucket", "dataset", Source("s3://bucket", "s3", bucket="bucket")),
    ("s3://bucket/", "model", Source("s3://bucket/", "s3", bucket="bucket")),
    ("s3://bucket/data/train", "dataset", Source("s3://bucket/data/train", "s3", bucket="bucket",
                                                 prefix="data/train")),
    ("s3://models/tiny/v2/", "model", Source("s3://models/tiny/v2/", "s3", bucket="models", prefix="tiny/v2/")),
])
def test_storage_uris_are_split_for_their_provider(uri: str, kind: str, expected: Source) -> None:
    assert parse_storage_uri(uri, kind) == expected


@pytest.mark.parametrize(("uri", "kind", "message"), [
    ("gs://x", "dataset", f"STORAGE_URI: unknown scheme in 'gs://x'; accepted: {ACCEPTED}"),
    ("tatsu-lab/alpaca", "dataset", f"STORAGE_URI: unknown scheme in 'tatsu-lab/alpaca'; accepted: {ACCEPTED}"),
    ("cache://schema/table", "dataset", "STORAGE_URI: 'cache://schema/table': Kubeflow's distributed data cache "
                                        f"(cache://) is not part of trainjob; use {ACCEPTED}"),
    ("s3://", "dataset", "STORAGE_URI: 's3://' names no bucket; expected s3://<bucket>[/<prefix>]"),
    ("s3:///prefix/only", "model", "STORAGE_URI: 's3:///prefix/only' names no bucket; expected "
                                   "s3://<bucket>[/<prefix>]"),
    ("hf://onlyname", "dataset", "STORAGE_URI: 'hf://onlyname' names no repository; expected "
                                 "hf://<owner>/<name>[@<revision>]"),
    ("hf://", "model", "STORAGE_URI: 'hf://' names no repository; expected hf://<owner>/<name>[@<revision>]"),
])
def test_a_bad_storage_uri_is_refused_naming_what_is_accepted(uri: str, kind: str, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_storage_uri(uri, kind)
    assert str(refused.value) == message
    assert refused.value.path == "STORAGE_URI"


def test_kubeflow_defaults_are_the_same_patterns() -> None:
    assert MODEL_IGNORE_PATTERNS == KUBEFLOW_MODEL_IGNORE
    assert HF_MODEL_ALLOW_PATTERNS == KUBEFLOW_HF_MODEL_ALLOW


@pytest.mark.parametrize(("kind", "env", "repo_id", "revision"), [
    ("dataset", {"STORAGE_URI": "hf://org/data"}, "org/data", None),
    ("dataset", {"STORAGE_URI": "hf://org/data@v1"}, "org/data", "v1"),
    ("dataset", {"STORAGE_URI": "hf://org/data@v1", "REVISION": "v2"}, "org/data", "v2"),
    ("dataset", {"STORAGE_URI": "hf://org/data", "REVISION": "refs/pr/3"}, "org/data", "refs/pr/3"),
    ("model", {"STORAGE_URI": "hf://org/tiny"}, "org/tiny", None),
    ("model", {"STORAGE_URI": "hf://org/tiny@dev", "REVISION": ""}, "org/tiny", "dev"),
    ("model", {"STORAGE_URI": "  hf://org/tiny@dev  ", "REVISION": "main"}, "org/tiny", "main"),
])
def test_the_revision_env_overrides_the_uris(kind: str, env: dict[str, str], repo_id: str,
                                              revision: str | None) -> None:
    source = InitializerConfig.from_env(kind, env).source
    assert (source.scheme, source.repo_id, source.revision) == ("hf", repo_id, revision)


@pytest.mark.parametrize(("kind", "env", "ignore", "allow"), [
    ("dataset", {"STORAGE_URI": "hf://org/data"}, (), None),
    ("dataset", {"STORAGE_URI": "s3://b/p"}, (), None),
    ("model", {"STORAGE_URI": "hf://org/tiny"}, KUBEFLOW_MODEL_IGNORE, KUBEFLOW_HF_MODEL_ALLOW),
    ("model", {"STORAGE_URI": "s3://b/tiny"}, KUBEFLOW_MODEL_IGNORE, None),  # the allow list is the Hub's only
    ("model", {"STORAGE_URI": "hf://org/tiny", "ALLOW_PATTERNS": "*"}, KUBEFLOW_MODEL_IGNORE, None),
    ("model", {"STORAGE_URI": "hf://org/tiny", "ALLOW_PATTERNS": "*.json, *"}, KUBEFLOW_MODEL_IGNORE, None),
    ("model", {"STORAGE_URI": "hf://org/tiny", "ALLOW_PATTERNS": "*.json,tokenizer.*"}, KUBEFLOW_MODEL_IGNORE,
     ("*.json", "tokenizer.*")),
    ("dataset", {"STORAGE_URI": "hf://org/data", "ALLOW_PATTERNS": "data/*"}, (), ("data/*",)),
    # split on commas, spaces stripped, empty items dropped
    ("dataset", {"STORAGE_URI": "s3://b/p", "IGNORE_PATTERNS": "*.md, *.txt ,, tmp/* "}, ("*.md", "*.txt", "tmp/*"),
     None),
    ("model", {"STORAGE_URI": "s3://b/tiny", "IGNORE_PATTERNS": "*.onnx"}, ("*.onnx",), None),
    ("model", {"STORAGE_URI": "hf://org/tiny", "IGNORE_PATTERNS": "*.bin, *.pt", "ALLOW_PATTERNS": "*.bin"},
     ("*.bin", "*.pt"), ("*.bin",)),
])
def test_file_patterns_and_their_defaults(kind: str, env: dict[str, str], ignore: tuple[str, ...],
                                          allow: tuple[str, ...] | None) -> None:
    config = InitializerConfig.from_env(kind, env)
    assert (config.ignore_patterns, config.allow_patterns) == (ignore, allow)


@pytest.mark.parametrize(("env", "token"), [
    ({}, None),
    ({"ACCESS_TOKEN": "hf_access"}, "hf_access"),
    ({"HF_TOKEN": "hf_fallback"}, "hf_fallback"),
    ({"ACCESS_TOKEN": "hf_access", "HF_TOKEN": "hf_fallback"}, "hf_access"),
    ({"ACCESS_TOKEN": "", "HF_TOKEN": "hf_fallback"}, "hf_fallback"),
])
def test_hf_token_is_the_fallback_for_access_token(env: dict[str, str], token: str | None) -> None:
    assert InitializerConfig.from_env("model", {"STORAGE_URI": "hf://org/tiny", **env}).access_token == token


@pytest.mark.parametrize(("kind", "env", "target"), [
    ("dataset", {}, "/workspace/dataset"),
    ("model", {}, "/workspace/model"),
    ("dataset", {"TRAINJOB_INITIALIZER_TARGET": "/data/job-1/dataset"}, "/data/job-1/dataset"),
    ("model", {"TRAINJOB_INITIALIZER_TARGET": ""}, "/workspace/model"),
])
def test_target_defaults_and_override(kind: str, env: dict[str, str], target: str) -> None:
    assert InitializerConfig.from_env(kind, {"STORAGE_URI": "s3://b/p", **env}).target == target


def test_every_s3_and_run_setting_is_read() -> None:
    config = InitializerConfig.from_env("dataset", {
        "STORAGE_URI": "s3://data/train", "ENDPOINT": "http://minio:9000", "ACCESS_KEY_ID": "AK",
        "SECRET_ACCESS_KEY": "SK", "REGION": "eu-west-1", "ROLE_ARN": "arn:aws:iam::1:role/r",
        "TRAINJOB_INITIALIZER_CACHE": "/cache", "TRAINJOB_INITIALIZER_PROGRESS": "/run/p.json",
        "HF_ENDPOINT": "http://hub:8080",
    })
    assert (config.kind, config.endpoint, config.access_key_id, config.secret_access_key, config.region,
            config.role_arn, config.cache_dir, config.progress_file, config.hf_endpoint) == (
        "dataset", "http://minio:9000", "AK", "SK", "eu-west-1", "arn:aws:iam::1:role/r", "/cache", "/run/p.json",
        "http://hub:8080")
    assert config.where() == "s3://data/train (at http://minio:9000)"


def test_unset_settings_are_none_not_empty_strings() -> None:
    config = InitializerConfig.from_env("dataset", {"STORAGE_URI": "hf://org/data", "ENDPOINT": "", "REGION": "",
                                                    "TRAINJOB_INITIALIZER_CACHE": ""})
    assert (config.endpoint, config.region, config.cache_dir, config.hf_endpoint) == (None, None, None, None)
    assert config.where() == "hf://org/data"


@pytest.mark.parametrize(("kind", "env", "message"), [
    ("dataset", {}, "STORAGE_URI: is not set; the TrainJob's spec.initializer.dataset.storageUri (or the runtime's "
                    "env) sets it, e.g. hf://<owner>/<name>"),
    ("model", {"STORAGE_URI": "   "}, "STORAGE_URI: is not set; the TrainJob's spec.initializer.model.storageUri "
                                      "(or the runtime's env) sets it, e.g. hf://<owner>/<name>"),
    ("dataset", {"STORAGE_URI": "gs://x"}, f"STORAGE_URI: unknown scheme in 'gs://x'; accepted: {ACCEPTED}"),
    ("dataset", {"STORAGE_URI": "cache://s/t"}, "STORAGE_URI: 'cache://s/t': Kubeflow's distributed data cache "
                                                f"(cache://) is not part of trainjob; use {ACCEPTED}"),
    ("model", {"STORAGE_URI": "s3://"}, "STORAGE_URI: 's3://' names no bucket; expected s3://<bucket>[/<prefix>]"),
    ("dataset", {"STORAGE_URI": "hf://onlyname"}, "STORAGE_URI: 'hf://onlyname' names no repository; expected "
                                                  "hf://<owner>/<name>[@<revision>]"),
    ("checkpoint", {"STORAGE_URI": "s3://b"}, "kind: must be one of dataset, model, got 'checkpoint'"),
])
def test_bad_environment_is_refused_with_the_exact_message(kind: str, env: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        InitializerConfig.from_env(kind, env)
    assert str(refused.value) == message


def test_from_env_reads_this_processs_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_URI", "s3://bucket/prefix")
    monkeypatch.setenv("TRAINJOB_INITIALIZER_TARGET", "/tmp/somewhere")
    config = InitializerConfig.from_env("dataset")
    assert (config.source.bucket, config.source.prefix, config.target) == ("bucket", "prefix", "/tmp/somewhere")
