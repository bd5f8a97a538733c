"""The Hub-compatible test server (:mod:`objectstore.hub`) against the real ``huggingface_hub`` client.

What the installed client (2.x) does, as these tests pin it down: ``snapshot_download`` asks
``GET /api/{models,datasets}/{repo}/revision/{rev}`` for the commit sha (skipped when the revision already is a
sha), ``GET /api/{type}s/{repo}/tree/{sha}?recursive=true`` for the file list, then per file
``HEAD /[datasets/]{repo}/resolve/{sha}/{file}`` (ETag, X-Repo-Commit, Content-Length) and ``GET`` of the same URL.
A transfer cut short is retried in place: 5 more GETs, one second apart, resuming with ``Range`` from the last
whole chunk received (chunks are 10 MiB, so a small file starts over); then the ``httpx2.RemoteProtocolError``
escapes ``snapshot_download`` as is, and no partial file is left behind.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

huggingface_hub = pytest.importorskip("huggingface_hub", minversion="1.0")

import httpx2  # noqa: E402 - comes with huggingface_hub
from huggingface_hub import HfApi, constants, file_download, get_hf_file_metadata, hf_hub_download, hf_hub_url  # noqa: E402
from huggingface_hub import snapshot_download as _snapshot_download  # noqa: E402
from huggingface_hub.errors import (  # noqa: E402
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from objectstore.hub import HubServer  # noqa: E402
from objectstore.sources import tiny_dataset, tiny_model  # noqa: E402

MODEL = "acme/tiny-model"
DATASET = "acme/tiny-data"
TOKEN = "hf_test_token"


@pytest.fixture(autouse=True)
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary HF_HOME; no token, no offline mode, no telemetry. ``huggingface_hub`` reads its settings when
    imported, so its ``constants`` are patched as well as the environment."""
    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE",
                 "HF_TOKEN_PATH", "HF_OIDC_RESOURCE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HUGGINGFACE_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    return home


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return tiny_model(tmp_path / "model")


@pytest.fixture
def dataset_dir(tmp_path: Path) -> Path:
    return tiny_dataset(tmp_path / "dataset", rows=100)


@pytest.fixture
def hub(model_dir: Path, dataset_dir: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        server.add_repo(MODEL, model_dir)
        server.add_repo(DATASET, dataset_dir, repo_type="dataset")
        yield server


def snapshot_download(repo_id: str, server: HubServer, **kwargs: object) -> Path:
    return Path(_snapshot_download(repo_id, endpoint=server.endpoint, **kwargs))  # type: ignore[arg-type]


def files_under(folder: Path) -> dict[str, bytes]:
    """The files under ``folder`` by POSIX relative path, without the client's ``.cache`` bookkeeping."""
    return {
        path.relative_to(folder).as_posix(): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file() and ".cache" not in path.relative_to(folder).parts
    }


def file_gets(server: HubServer) -> list[str]:
    return [path for method, path in server.requests if method == "GET" and "/resolve/" in path]


def test_snapshot_download_fetches_identical_model_and_dataset(
    hub: HubServer, model_dir: Path, dataset_dir: Path, tmp_path: Path
) -> None:
    model = snapshot_download(MODEL, hub, local_dir=tmp_path / "out-model")
    dataset = snapshot_download(DATASET, hub, repo_type="dataset", local_dir=tmp_path / "out-data")

    assert model == tmp_path / "out-model"
    assert files_under(model) == files_under(model_dir)
    assert files_under(dataset) == files_under(dataset_dir)
    assert set(files_under(dataset)) == {"data/train.jsonl", "README.md"}
    sha = HfApi(endpoint=hub.endpoint).repo_info(DATASET, repo_type="dataset").sha
    assert ("GET", f"/api/datasets/{DATASET}/revision/main") in hub.requests
    assert ("GET", f"/api/datasets/{DATASET}/tree/{sha}") in hub.requests
    assert ("HEAD", f"/datasets/{DATASET}/resolve/{sha}/data/train.jsonl") in hub.requests
    assert ("GET", f"/datasets/{DATASET}/resolve/{sha}/data/train.jsonl") in hub.requests


def test_snapshot_download_into_the_cache(hub: HubServer, model_dir: Path, hf_home: Path) -> None:
    snapshot = snapshot_download(MODEL, hub)

    sha = HfApi(endpoint=hub.endpoint).repo_info(MODEL).sha
    assert snapshot == hf_home / "hub" / "models--acme--tiny-model" / "snapshots" / str(sha)
    assert files_under(snapshot) == files_under(model_dir)
    assert (hf_home / "hub" / "models--acme--tiny-model" / "refs" / "main").read_text() == sha


def test_a_second_download_makes_no_file_requests(hub: HubServer, model_dir: Path, tmp_path: Path) -> None:
    snapshot_download(MODEL, hub, local_dir=tmp_path / "out")
    assert len(file_gets(hub)) == 3
    hub.requests.clear()

    snapshot_download(MODEL, hub, local_dir=tmp_path / "out")
    # Only the branch is resolved again; the tree listing is cached by commit, the files by their metadata.
    assert hub.requests == [("GET", f"/api/models/{MODEL}/revision/main")]

    snapshot_download(MODEL, hub)  # into the cache dir this time
    hub.requests.clear()
    snapshot_download(MODEL, hub)
    assert hub.requests == [("GET", f"/api/models/{MODEL}/revision/main")]

    sha = HfApi(endpoint=hub.endpoint).repo_info(MODEL).sha
    hub.requests.clear()
    snapshot_download(MODEL, hub, revision=sha)
    assert hub.requests == []  # a commit sha needs no resolving at all


def test_an_earlier_commit_stays_addressable_by_sha(hub: HubServer, model_dir: Path, tmp_path: Path) -> None:
    api = HfApi(endpoint=hub.endpoint)
    first = api.repo_info(MODEL).sha
    assert hub.add_repo(MODEL, model_dir) == first  # same content, same commit

    (model_dir / "config.json").write_text('{"model_type": "tiny", "hidden_size": 16}\n')
    (model_dir / "generation_config.json").write_text("{}\n")
    second = hub.add_repo(MODEL, model_dir)

    assert second != first
    assert api.repo_info(MODEL).sha == second
    assert api.repo_info(MODEL, revision=first).sha == first
    assert "generation_config.json" in api.list_repo_files(MODEL)
    assert "generation_config.json" not in api.list_repo_files(MODEL, revision=first)

    latest = snapshot_download(MODEL, hub, local_dir=tmp_path / "latest")
    earlier = snapshot_download(MODEL, hub, revision=first, local_dir=tmp_path / "earlier")
    assert files_under(latest) == files_under(model_dir)
    assert b"16" in files_under(latest)["config.json"]
    assert b"8" in files_under(earlier)["config.json"]
    assert "generation_config.json" not in files_under(earlier)


def test_allow_and_ignore_patterns(hub: HubServer, tmp_path: Path) -> None:
    only_json = snapshot_download(MODEL, hub, local_dir=tmp_path / "json", allow_patterns=["*.json"])
    assert set(files_under(only_json)) == {"config.json", "tokenizer.json"}
    assert not any(path.endswith(".safetensors") for path in file_gets(hub))

    no_weights = snapshot_download(MODEL, hub, local_dir=tmp_path / "light", ignore_patterns="*.safetensors")
    assert set(files_under(no_weights)) == {"config.json", "tokenizer.json"}

    data_only = snapshot_download(DATASET, hub, repo_type="dataset", local_dir=tmp_path / "d", allow_patterns="data/*")
    assert set(files_under(data_only)) == {"data/train.jsonl"}


def test_a_token_protected_server_refuses_without_the_token(model_dir: Path, tmp_path: Path) -> None:
    with HubServer(token=TOKEN) as server:
        server.add_repo(MODEL, model_dir)
        for token in (None, "hf_wrong"):
            with pytest.raises(RepositoryNotFoundError) as refused:
                snapshot_download(MODEL, server, local_dir=tmp_path / "refused", token=token)
            assert MODEL in str(refused.value)
            assert refused.value.repo_id == MODEL
            assert refused.value.response.status_code == 401
        assert not (tmp_path / "refused" / "config.json").exists()
        assert {served.status for served in server.served} == {401}

        got = snapshot_download(MODEL, server, local_dir=tmp_path / "granted", token=TOKEN)
        assert files_under(got) == files_under(model_dir)
        api = HfApi(endpoint=server.endpoint, token=TOKEN)
        assert set(api.list_repo_files(MODEL)) == {"config.json", "model.safetensors", "tokenizer.json"}


def test_a_gated_repo_raises_gated_repo_error(model_dir: Path, tmp_path: Path) -> None:
    with HubServer(token=TOKEN, gated=True) as server:
        server.add_repo(MODEL, model_dir)
        with pytest.raises(GatedRepoError, match=MODEL):
            snapshot_download(MODEL, server, local_dir=tmp_path / "refused")
        with pytest.raises(GatedRepoError, match=MODEL):
            hf_hub_download(MODEL, "config.json", endpoint=server.endpoint)


def test_unknown_repo_revision_and_file(hub: HubServer, tmp_path: Path) -> None:
    with pytest.raises(RepositoryNotFoundError, match="acme/missing") as missing:
        snapshot_download("acme/missing", hub, local_dir=tmp_path / "x")
    assert missing.value.response.status_code == 404
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download(MODEL, hub, repo_type="dataset", local_dir=tmp_path / "x")  # a model, asked as a dataset
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(MODEL, hub, revision="no-such-branch", local_dir=tmp_path / "x")
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(MODEL, hub, revision="0" * 40, local_dir=tmp_path / "x")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(MODEL, "no-such-file.bin", endpoint=hub.endpoint)


def test_hf_hub_download_and_file_metadata(hub: HubServer, model_dir: Path) -> None:
    import hashlib

    path = hf_hub_download(MODEL, "model.safetensors", endpoint=hub.endpoint)
    assert Path(path).read_bytes() == (model_dir / "model.safetensors").read_bytes()

    url = hf_hub_url(MODEL, "model.safetensors", endpoint=hub.endpoint)
    metadata = get_hf_file_metadata(url)
    assert metadata.etag == hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()
    assert metadata.commit_hash == HfApi(endpoint=hub.endpoint).repo_info(MODEL).sha
    assert metadata.size == 300_000
    assert metadata.xet_file_data is None  # plain HTTP, never Xet


def test_range_requests_and_head(hub: HubServer, model_dir: Path) -> None:
    url = f"{hub.endpoint}/{MODEL}/resolve/main/config.json"
    content = (model_dir / "config.json").read_bytes()

    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=2-6"})) as answer:
        assert answer.status == 206
        assert answer.headers["Content-Range"] == f"bytes 2-6/{len(content)}"
        assert answer.read() == content[2:7]
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=-4"})) as answer:
        assert answer.read() == content[-4:]
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Length"] == str(len(content))
        assert answer.headers["X-Repo-Commit"]
        assert answer.read() == b""
    with pytest.raises(urllib.error.HTTPError) as beyond:
        urllib.request.urlopen(urllib.request.Request(url, headers={"Range": f"bytes={len(content)}-"}))
    assert beyond.value.code == 416


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's one-second pauses between download retries, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(file_download, "time", SimpleNamespace(sleep=slept.append))
    return slept


def test_a_dropped_transfer_is_retried_from_the_start(
    hub: HubServer, model_dir: Path, tmp_path: Path, sleeps: list[float]
) -> None:
    hub.drop_after("model.safetensors", 100_000)

    out = snapshot_download(MODEL, hub, local_dir=tmp_path / "out")

    assert files_under(out) == files_under(model_dir)
    weights = [s for s in hub.served if s.method == "GET" and s.path.endswith("model.safetensors")]
    # Chunks are 10 MiB: the 100,000 bytes received made no whole chunk, so nothing was kept and no Range is asked.
    assert [(s.status, s.range) for s in weights] == [(200, None), (200, None)]
    assert sleeps == [1]


def test_a_dropped_transfer_resumes_with_a_range(
    hub: HubServer, model_dir: Path, tmp_path: Path, sleeps: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16_384)
    hub.drop_after("model.safetensors", 100_000)

    out = snapshot_download(MODEL, hub, local_dir=tmp_path / "out")

    assert files_under(out) == files_under(model_dir)
    weights = [s for s in hub.served if s.method == "GET" and s.path.endswith("model.safetensors")]
    kept = 100_000 // 16_384 * 16_384  # the whole chunks received before the cut
    assert [(s.status, s.range) for s in weights] == [(200, None), (206, f"bytes={kept}-")]


def test_a_transfer_dropped_every_time_fails_and_leaves_no_partial_file(
    hub: HubServer, tmp_path: Path, sleeps: list[float]
) -> None:
    hub.drop_after("model.safetensors", 0, times=100)
    out = tmp_path / "out"

    with pytest.raises(httpx2.RemoteProtocolError, match="peer closed connection"):
        snapshot_download(MODEL, hub, local_dir=out)

    assert len([p for p in file_gets(hub) if p.endswith("model.safetensors")]) == 6
    assert sleeps == [1] * 5
    assert not (out / "model.safetensors").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".incomplete")]


def test_stop_closes_the_port(model_dir: Path) -> None:
    server = HubServer()
    server.add_repo(MODEL, model_dir)
    with urllib.request.urlopen(f"{server.endpoint}/api/models/{MODEL}") as answer:
        assert answer.status == 200
    server.stop()
    server.stop()  # idempotent
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", server.port), timeout=2):
        pass
