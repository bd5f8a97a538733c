"""``initialize`` against real servers: the Hub-compatible :class:`HubServer` (a thread of this process) with the
real ``huggingface_hub`` client, and VersityGW (:class:`S3Server`, a process: those tests are in the procs tier)
with the real boto3. What arrives, what the cache shares, what a refusal, a dropped connection and a full disk
leave behind, and the ``python -m trainjob.initializers`` command.

``huggingface_hub`` reads ``HF_*`` settings when imported, so the Hub's endpoint reaches the initializer through
``HF_ENDPOINT`` in the environment mapping given to :meth:`InitializerConfig.from_env`, never through
``os.environ``."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from huggingface_hub import constants, file_download
from jobtest.tiers import starts
from objectstore.hub import HubServer
from objectstore.s3 import S3Server, require_s3_server
from objectstore.sources import tiny_dataset, tiny_model

from trainjob.errors import DownloadError
from trainjob.initializers import run, transfer
from trainjob.initializers.__main__ import REFUSED_EXIT_CODE
from trainjob.initializers.cache import DataCache
from trainjob.initializers.config import InitializerConfig
from trainjob.initializers.run import initialize, marker_path

MODEL = "acme/tiny-model"
DATASET = "acme/tiny-data"
TOKEN = "hf_test_token"
BUCKET = "initializers"
MiB = 1024 * 1024
#: A refusal is not tried again: far under this (a sanity bound, not a performance figure).
FAILS_WITHIN_SECONDS = 20
#: The initializer env variables, kept out of the CLI's environment unless a test sets them.
INITIALIZER_ENV = ("STORAGE_URI", "ACCESS_TOKEN", "HF_TOKEN", "ENDPOINT", "ACCESS_KEY_ID", "SECRET_ACCESS_KEY",
                   "REGION", "ROLE_ARN", "IGNORE_PATTERNS", "ALLOW_PATTERNS", "REVISION", "HF_ENDPOINT",
                   "TRAINJOB_INITIALIZER_TARGET", "TRAINJOB_INITIALIZER_CACHE", "TRAINJOB_INITIALIZER_PROGRESS")


def quiet(line: str) -> None:
    """The run's log lines, dropped."""


def files_under(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by POSIX relative path (nothing left out: the Hub client's ``.cache`` would
    show)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_nothing_left(target: Path) -> None:
    """No target, no marker, and no ``.partial`` staging folder beside it."""
    assert not target.exists()
    assert not marker_path(target).exists()
    if target.parent.exists():
        assert not list(target.parent.glob("*.partial"))


def refused(config: InitializerConfig) -> DownloadError:
    """The ``DownloadError`` that ``config``'s run fails with, at once, not to be retried, leaving nothing."""
    started = time.monotonic()
    with pytest.raises(DownloadError) as caught:
        initialize(config, quiet)
    assert time.monotonic() - started < FAILS_WITHIN_SECONDS
    assert caught.value.retryable is False
    assert config.source.uri in str(caught.value)
    assert_nothing_left(Path(config.target))
    return caught.value


# the Hub


@pytest.fixture(autouse=True)
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary HF_HOME without a token: no setting of this machine's reaches the client."""
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE", "HF_TOKEN_PATH",
                 "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return home


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return tiny_model(tmp_path / "src-model", with_bin=True)


@pytest.fixture
def dataset_dir(tmp_path: Path) -> Path:
    return tiny_dataset(tmp_path / "src-dataset", rows=300)


@pytest.fixture
def hub(model_dir: Path, dataset_dir: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo(MODEL, model_dir)
        server.add_repo(DATASET, dataset_dir, repo_type="dataset")
        yield server


@pytest.fixture
def no_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The Hub client's pauses between its own retries, and the run's back-off, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(file_download, "time", SimpleNamespace(sleep=slept.append))
    monkeypatch.setattr(run, "BACKOFF_SECONDS", 0.0)
    return slept


def hf_config(kind: str, hub: HubServer, target: Path, **env: str) -> InitializerConfig:
    repo = DATASET if kind == "dataset" else MODEL
    return InitializerConfig.from_env(kind, {"STORAGE_URI": f"hf://{repo}", "HF_ENDPOINT": hub.endpoint,
                                             "TRAINJOB_INITIALIZER_TARGET": str(target), **env})


def file_gets(hub: HubServer) -> list[str]:
    return [path for method, path in hub.requests if method == "GET" and "/resolve/" in path]


def model_files(model_dir: Path) -> dict[str, bytes]:
    return {name: data for name, data in files_under(model_dir).items() if not name.endswith(".bin")}


def test_an_hf_dataset_arrives_with_identical_bytes_and_a_marker_naming_its_version(
    hub: HubServer, dataset_dir: Path, tmp_path: Path
) -> None:
    target = tmp_path / "workspace" / "dataset"
    outcome = initialize(hf_config("dataset", hub, target), quiet)

    assert outcome.how == "downloaded"
    assert files_under(target) == files_under(dataset_dir)
    sha = hub.add_repo(DATASET, dataset_dir, repo_type="dataset")  # the same content: the same commit
    marker = json.loads(marker_path(target).read_text())
    assert (marker["version"], marker["uri"], marker["kind"]) == (sha, f"hf://{DATASET}", "dataset")
    assert outcome.listing.version == sha


def test_an_hf_model_leaves_out_the_bin_weights(hub: HubServer, model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "workspace" / "model"
    outcome = initialize(hf_config("model", hub, target), quiet)

    assert outcome.how == "downloaded"
    assert files_under(target) == model_files(model_dir)
    assert not any(path.endswith("pytorch_model.bin") for path in file_gets(hub))
    safetensors = next(f for f in outcome.listing.files if f.path == "model.safetensors")
    assert safetensors.checksum == ("sha256", hashlib.sha256((model_dir / "model.safetensors").read_bytes())
                                    .hexdigest())


def test_a_second_run_of_the_same_config_finds_the_files_present(hub: HubServer, model_dir: Path,
                                                                 tmp_path: Path) -> None:
    config = hf_config("model", hub, tmp_path / "workspace" / "model")
    assert initialize(config, quiet).how == "downloaded"
    hub.requests.clear()

    assert initialize(config, quiet).how == "present"
    assert file_gets(hub) == []
    assert files_under(Path(config.target)) == model_files(model_dir)


def test_a_second_job_links_the_cached_files_and_fetches_nothing(hub: HubServer, model_dir: Path,
                                                                 tmp_path: Path) -> None:
    cache = {"TRAINJOB_INITIALIZER_CACHE": str(tmp_path / "cache")}
    first = initialize(hf_config("model", hub, tmp_path / "job-1" / "model", **cache), quiet)
    hub.requests.clear()
    second = initialize(hf_config("model", hub, tmp_path / "job-2" / "model", **cache), quiet)

    assert (first.how, second.how) == ("downloaded", "cached")
    assert first.key == second.key
    assert file_gets(hub) == []
    entry = DataCache(tmp_path / "cache").entry_dir(second.key) / "data"
    assert files_under(second.target) == files_under(entry) == model_files(model_dir)
    for name in model_files(model_dir):
        linked, cached = (second.target / name).stat(), (entry / name).stat()
        assert linked.st_ino == cached.st_ino
        assert linked.st_mode & 0o222 == 0, f"{name} is writable: {oct(linked.st_mode)}"


def test_a_new_commit_is_a_new_cache_entry_and_prune_removes_only_what_it_names(
    hub: HubServer, model_dir: Path, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    cache = {"TRAINJOB_INITIALIZER_CACHE": str(cache_dir)}
    old = initialize(hf_config("model", hub, tmp_path / "job-1" / "model", **cache), quiet)
    (model_dir / "config.json").write_text('{"model_type": "tiny", "hidden_size": 16}\n')
    hub.add_repo(MODEL, model_dir)

    new = initialize(hf_config("model", hub, tmp_path / "job-2" / "model", **cache), quiet)

    assert new.how == "downloaded"
    assert new.key != old.key
    assert b"16" in (new.target / "config.json").read_bytes()
    store = DataCache(cache_dir)
    assert {e.key for e in store.entries()} == {old.key, new.key}
    assert store.prune(older_than_seconds=3600) == []
    assert [e.key for e in store.prune(keys=[old.key[:8]])] == [old.key]
    assert [e.key for e in store.entries()] == [new.key]
    assert not store.entry_dir(old.key).exists()
    assert files_under(new.target) == model_files(model_dir)  # links of the entry kept stay whole


def test_a_missing_hub_repo_fails_at_once_saying_not_found(hub: HubServer, tmp_path: Path) -> None:
    config = hf_config("model", hub, tmp_path / "ws" / "model", STORAGE_URI="hf://acme/missing")
    error = refused(config)
    assert "404" in str(error)
    assert "'acme/missing' (model) not found" in str(error)


def test_a_token_protected_hub_refuses_a_job_without_the_token(model_dir: Path, tmp_path: Path) -> None:
    with HubServer(token=TOKEN) as server:
        server.add_repo(MODEL, model_dir)
        error = refused(hf_config("model", server, tmp_path / "ws" / "model"))
    assert "401" in str(error)
    assert "not found, or private and no token was given" in str(error)


def test_a_token_protected_hub_serves_a_job_with_hf_token(model_dir: Path, tmp_path: Path) -> None:
    with HubServer(token=TOKEN) as server:
        server.add_repo(MODEL, model_dir)
        outcome = initialize(hf_config("model", server, tmp_path / "ws" / "model", HF_TOKEN=TOKEN), quiet)
        assert {s.authorized for s in server.served} == {True}
    assert files_under(outcome.target) == model_files(model_dir)


def test_a_missing_revision_fails_at_once_naming_it(hub: HubServer, tmp_path: Path) -> None:
    error = refused(hf_config("dataset", hub, tmp_path / "ws" / "dataset", REVISION="no-such-branch"))
    assert "404 revision 'no-such-branch' not found" in str(error)


def test_a_connection_dropped_once_is_retried_to_identical_bytes(
    hub: HubServer, model_dir: Path, tmp_path: Path, no_sleeps: list[float]
) -> None:
    hub.drop_after("model.safetensors", 1000, times=1)
    outcome = initialize(hf_config("model", hub, tmp_path / "ws" / "model"), quiet)

    assert outcome.how == "downloaded"
    assert files_under(outcome.target) == model_files(model_dir)
    assert len([p for p in file_gets(hub) if p.endswith("model.safetensors")]) == 2


def test_a_connection_dropped_every_time_fails_leaving_no_file_under_its_name(
    hub: HubServer, model_dir: Path, tmp_path: Path, no_sleeps: list[float]
) -> None:
    hub.drop_after("model.safetensors", 1000, times=20)
    cache_dir = tmp_path / "cache"
    target = tmp_path / "ws" / "model"
    config = hf_config("model", hub, target, TRAINJOB_INITIALIZER_CACHE=str(cache_dir))

    with pytest.raises(DownloadError) as caught:
        initialize(config, quiet)

    assert f"hf://{MODEL}" in str(caught.value)
    assert not target.exists()
    assert not marker_path(target).exists()
    assert not [p for p in cache_dir.rglob("model.safetensors")]
    assert DataCache(cache_dir).entries() == []
    gets = [p for p in file_gets(hub) if p.endswith("model.safetensors")]
    assert len(gets) == 6 * run.ATTEMPTS  # the client's own six tries, in each of the run's attempts


def test_a_file_whose_bytes_differ_from_its_sha256_is_fetched_again(
    hub: HubServer, model_dir: Path, tmp_path: Path, no_sleeps: list[float]
) -> None:
    hub.corrupt("model.safetensors", times=1)
    outcome = initialize(hf_config("model", hub, tmp_path / "ws" / "model"), quiet)

    assert files_under(outcome.target) == model_files(model_dir)
    assert len([p for p in file_gets(hub) if p.endswith("model.safetensors")]) == 2


def test_a_file_corrupted_every_time_fails_naming_the_checksums_and_keeps_nothing(
    hub: HubServer, tmp_path: Path, no_sleeps: list[float]
) -> None:
    hub.corrupt("model.safetensors", times=100)
    target = tmp_path / "ws" / "model"

    with pytest.raises(DownloadError) as caught:
        initialize(hf_config("model", hub, target), quiet)

    assert "model.safetensors has sha256" in str(caught.value)
    assert "the source lists" in str(caught.value)
    assert not target.exists()
    assert not list((tmp_path / "ws").rglob("model.safetensors"))  # the bad bytes are never kept
    assert len([p for p in file_gets(hub) if p.endswith("model.safetensors")]) == run.ATTEMPTS


def test_a_stopped_download_resumes_fetching_only_what_is_missing(
    hub: HubServer, model_dir: Path, tmp_path: Path, no_sleeps: list[float]
) -> None:
    hub.drop_after("model.safetensors", 1000, times=6 * run.ATTEMPTS)
    config = hf_config("model", hub, tmp_path / "ws" / "model", TRAINJOB_INITIALIZER_CACHE=str(tmp_path / "c"))
    with pytest.raises(DownloadError):
        initialize(config, quiet)
    hub.requests.clear()

    outcome = initialize(config, quiet)

    assert outcome.how == "downloaded"
    assert files_under(outcome.target) == model_files(model_dir)
    assert [p.rsplit("/", 1)[-1] for p in file_gets(hub)] == ["model.safetensors"]


@pytest.fixture
@starts("procs")
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs of 256 KiB (``mount`` needs root), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    folder = tmp_path / "small-disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)], check=True,
                   capture_output=True, text=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True, capture_output=True, text=True)
        assert str(folder) not in Path("/proc/mounts").read_text()


@pytest.mark.filterwarnings("ignore:Not enough free disk space")  # the Hub client's, before it tries anyway
def test_a_full_disk_fails_naming_it_and_leaves_nothing(hub: HubServer, small_disk: Path) -> None:
    target = small_disk / "model"
    with pytest.raises(DownloadError) as caught:
        initialize(hf_config("model", hub, target), quiet)

    assert "no space left on device" in str(caught.value)
    assert f"hf://{MODEL}" in str(caught.value)
    assert caught.value.retryable is False
    assert_nothing_left(target)
    assert list(small_disk.iterdir()) == []


# S3

S3_DATASET = {  # key under datasets/tiny/ -> content
    "README.md": b"# tiny\n",
    "train/part-0.jsonl": b"".join(b'{"text": "train %d"}\n' % i for i in range(200)),
    "train/part-1.jsonl": b"".join(b'{"text": "more %d"}\n' % i for i in range(200)),
    "eval/nested/deeper/part-0.jsonl": b'{"text": "eval"}\n' * 50,
}
S3_MODEL = {
    "config.json": b'{"model_type": "tiny"}\n',
    "model.safetensors": random.Random(3).randbytes(300_000),
    "tokenizer.json": b'{"version": "1.0"}\n',
    "pytorch_model.bin": random.Random(4).randbytes(20_000),
    "optimizer.pt": b"pt" * 100,
}


@pytest.fixture(scope="module")
@starts("procs")
def s3() -> Iterator[S3Server]:
    """One VersityGW for the module, with bucket ``initializers`` holding ``datasets/tiny/`` and ``models/tiny/``,
    and an object beside the dataset's prefix that must not be fetched with it."""
    binary = require_s3_server()
    with S3Server(binary=binary) as server:
        server.make_bucket(BUCKET)
        for name, data in S3_DATASET.items():
            server.put(BUCKET, f"datasets/tiny/{name}", data)
        for name, data in S3_MODEL.items():
            server.put(BUCKET, f"models/tiny/{name}", data)
        server.put(BUCKET, "datasets/other.jsonl", b"not this one\n")
        yield server


def s3_config(kind: str, s3: S3Server, uri: str, target: Path, **env: str) -> InitializerConfig:
    return InitializerConfig.from_env(kind, {
        "STORAGE_URI": uri, "ENDPOINT": s3.endpoint, "ACCESS_KEY_ID": s3.access_key,
        "SECRET_ACCESS_KEY": s3.secret_key, "REGION": s3.region, "TRAINJOB_INITIALIZER_TARGET": str(target), **env})


def test_an_s3_dataset_with_nested_keys_arrives_md5_verified(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digests: list[tuple[str, str]] = []  # (path, algorithm) of every checksum the run computed
    real_digest = transfer.file_digest
    monkeypatch.setattr(transfer, "file_digest",
                        lambda path, algorithm: digests.append((str(path), algorithm)) or real_digest(path, algorithm))

    outcome = initialize(s3_config("dataset", s3, f"s3://{BUCKET}/datasets/tiny/", tmp_path / "ws" / "dataset"),
                         quiet)

    assert outcome.how == "downloaded"
    assert files_under(outcome.target) == S3_DATASET
    assert {f.path: f.checksum for f in outcome.listing.files} == {
        name: ("md5", hashlib.md5(data).hexdigest()) for name, data in S3_DATASET.items()}
    checked = [path.removesuffix(".part") for path, algorithm in digests if algorithm == "md5"]
    assert all(any(path.endswith(f"/{name}") for path in checked) for name in S3_DATASET), checked


def test_an_s3_dataset_honours_its_ignore_patterns(s3: S3Server, tmp_path: Path) -> None:
    config = s3_config("dataset", s3, f"s3://{BUCKET}/datasets/tiny", tmp_path / "ws" / "dataset",
                       IGNORE_PATTERNS="README.md, */eval/*")  # a file name, a pattern of the whole key
    outcome = initialize(config, quiet)
    assert files_under(outcome.target) == {k: v for k, v in S3_DATASET.items() if k.startswith("train/")}


def test_an_s3_ignore_pattern_of_the_path_under_the_target_is_honoured(s3: S3Server, tmp_path: Path) -> None:
    config = s3_config("dataset", s3, f"s3://{BUCKET}/datasets/tiny", tmp_path / "ws" / "dataset",
                       IGNORE_PATTERNS="eval/*")
    outcome = initialize(config, quiet)
    assert files_under(outcome.target) == {k: v for k, v in S3_DATASET.items() if not k.startswith("eval/")}


def test_an_s3_model_leaves_out_kubeflows_default_patterns(s3: S3Server, tmp_path: Path) -> None:
    outcome = initialize(s3_config("model", s3, f"s3://{BUCKET}/models/tiny", tmp_path / "ws" / "model"), quiet)
    assert files_under(outcome.target) == {k: v for k, v in S3_MODEL.items() if k.endswith((".json", ".safetensors"))}


def test_a_multipart_object_has_no_md5_and_still_downloads(s3: S3Server, tmp_path: Path) -> None:
    from boto3.s3.transfer import TransferConfig

    big = tmp_path / "big.bin"
    big.write_bytes(random.Random(5).randbytes(6 * MiB + 123))
    s3.client().upload_file(str(big), BUCKET, "multipart/big.bin",
                            Config=TransferConfig(multipart_threshold=MiB, multipart_chunksize=5 * MiB))
    s3.put(BUCKET, "multipart/config.json", b"{}\n")

    outcome = initialize(s3_config("dataset", s3, f"s3://{BUCKET}/multipart", tmp_path / "ws" / "dataset"), quiet)

    assert {f.path: f.checksum is None for f in outcome.listing.files} == {"big.bin": True, "config.json": False}
    assert files_under(outcome.target) == {"big.bin": big.read_bytes(), "config.json": b"{}\n"}


@pytest.mark.parametrize(("case", "answer"), [
    ("wrong secret", "403 SignatureDoesNotMatch"),
    ("outsider", "403 AccessDenied"),
    ("missing bucket", "404 NoSuchBucket"),
    ("empty prefix", "no objects under s3://initializers/nothing/here"),
])
def test_an_s3_refusal_fails_at_once_naming_the_uri_and_the_answer(
    s3: S3Server, tmp_path: Path, case: str, answer: str
) -> None:
    uri, env = f"s3://{BUCKET}/datasets/tiny", {}
    if case == "wrong secret":
        env = {"SECRET_ACCESS_KEY": "not-the-secret"}
    elif case == "outsider":
        env = {"ACCESS_KEY_ID": s3.outsider_access_key, "SECRET_ACCESS_KEY": s3.outsider_secret_key}
    elif case == "missing bucket":
        uri = "s3://no-such-bucket/data"
    else:
        uri = f"s3://{BUCKET}/nothing/here"
    error = refused(s3_config("dataset", s3, uri, tmp_path / "ws" / "dataset", **env))
    assert answer in str(error)
    assert f"{uri} (at {s3.endpoint})" in str(error)


# the command


@pytest.fixture
@starts("procs")
def cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``python -m trainjob.initializers ARGS`` with an environment of only the given initializer settings."""
    base = {k: v for k, v in os.environ.items() if k not in INITIALIZER_ENV}

    def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainjob.initializers", *args], env={**base, **(env or {})},
                              cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    return run_cli


def test_the_command_fills_the_target_from_s3(s3: S3Server, cli: Callable[..., Any], tmp_path: Path) -> None:
    target = tmp_path / "ws" / "dataset"
    done = cli("dataset", env={
        "STORAGE_URI": f"s3://{BUCKET}/datasets/tiny", "ENDPOINT": s3.endpoint, "ACCESS_KEY_ID": s3.access_key,
        "SECRET_ACCESS_KEY": s3.secret_key, "TRAINJOB_INITIALIZER_TARGET": str(target)})
    assert done.returncode == 0, done.stderr
    assert files_under(target) == S3_DATASET
    summary = done.stderr.strip().splitlines()[-1]
    assert summary.startswith(f"dataset s3://{BUCKET}/datasets/tiny at ")
    assert summary.endswith(f": {target}")
    assert " downloaded in " in summary


def test_the_command_exits_refused_when_s3_refuses_the_credentials(s3: S3Server, cli: Callable[..., Any],
                                                                  tmp_path: Path) -> None:
    done = cli("model", env={
        "STORAGE_URI": f"s3://{BUCKET}/models/tiny", "ENDPOINT": s3.endpoint, "ACCESS_KEY_ID": s3.access_key,
        "SECRET_ACCESS_KEY": "not-the-secret", "TRAINJOB_INITIALIZER_TARGET": str(tmp_path / "ws" / "model")})
    assert done.returncode == REFUSED_EXIT_CODE
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: s3://{BUCKET}/models/tiny (at {s3.endpoint}): listing: 403 SignatureDoesNotMatch")
    assert not (tmp_path / "ws" / "model").exists()


def test_the_command_names_the_accepted_schemes_for_an_unknown_one(cli: Callable[..., Any]) -> None:
    done = cli("dataset", env={"STORAGE_URI": "gs://bucket/data"})
    assert done.returncode == REFUSED_EXIT_CODE  # bad input: trying again cannot help
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ")
    assert "'gs://bucket/data'" in last
    assert "hf://<owner>/<name>[@<revision>] or s3://<bucket>[/<prefix>]" in last


def test_the_command_without_arguments_is_a_usage_error(cli: Callable[..., Any]) -> None:
    done = cli()
    assert done.returncode == 2
    assert "usage: python -m trainjob.initializers {dataset|model}" in done.stderr
