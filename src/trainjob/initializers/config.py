"""What an initializer is asked to fetch: Kubeflow's environment contract, read once, and the storage URI parsed.

==========================  =====================================================================================
variable                    meaning (Kubeflow Trainer v2.3's ``pkg/initializers`` and SDK 0.5 set the first eight)
==========================  =====================================================================================
``STORAGE_URI``             ``hf://<owner>/<name>[@<revision>]`` or ``s3://<bucket>[/<prefix>]`` (required)
``ACCESS_TOKEN``            a Hugging Face token (``HF_TOKEN`` is read too, as ``huggingface_hub`` does)
``ENDPOINT``                the S3 endpoint URL (``http://minio:9000``); the Hub's is ``HF_ENDPOINT``
``ACCESS_KEY_ID``           S3 credentials; without them boto3's chain (``AWS_*`` env, files, roles) is used
``SECRET_ACCESS_KEY``
``REGION``                  S3 region (default ``us-east-1``)
``ROLE_ARN``                an IAM role to assume (STS) before reading S3
``IGNORE_PATTERNS``         comma-separated glob patterns of files to leave out (a model defaults to Kubeflow's
                            ``*.msgpack,*.h5,*.bin,*.pt,*.pth``)
``REVISION``                a Hub branch, tag or commit (else the URI's ``@revision``, else ``main``)
``ALLOW_PATTERNS``          comma-separated patterns to keep; a Hub model keeps Kubeflow's ``*.json,*.safetensors,
                            *.model,*.txt`` unless this is set (``*`` keeps everything)
``TRAINJOB_INITIALIZER_TARGET``   where the files go (default ``/workspace/dataset`` or ``/workspace/model``)
``TRAINJOB_INITIALIZER_CACHE``    a cache folder shared by jobs (:mod:`~trainjob.initializers.cache`); unset: none
``TRAINJOB_INITIALIZER_PROGRESS`` a JSON file the initializer keeps its progress in (the local supervisor reads it)
==========================  =====================================================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from trainjob.errors import ValidationError

DATASET = "dataset"
MODEL = "model"
KINDS = (DATASET, MODEL)
HF_SCHEME = "hf"
S3_SCHEME = "s3"
#: Kubeflow's distributed data cache (``DataCacheInitializer``): not part of trainjob.
KUBEFLOW_CACHE_SCHEME = "cache"
SCHEMES = (HF_SCHEME, S3_SCHEME)
WORKSPACE = "/workspace"
#: Where Kubeflow's initializers (and trainers) expect the files: ``/workspace/dataset``, ``/workspace/model``.
DEFAULT_TARGETS = {DATASET: f"{WORKSPACE}/dataset", MODEL: f"{WORKSPACE}/model"}
#: Kubeflow SDK's ``INITIALIZER_DEFAULT_IGNORE_PATTERNS`` for models.
MODEL_IGNORE_PATTERNS = ("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth")
#: The files Kubeflow's Hub model initializer downloads.
HF_MODEL_ALLOW_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt")

STORAGE_URI_ENV = "STORAGE_URI"
TARGET_ENV = "TRAINJOB_INITIALIZER_TARGET"
CACHE_ENV = "TRAINJOB_INITIALIZER_CACHE"
PROGRESS_ENV = "TRAINJOB_INITIALIZER_PROGRESS"


#: Kubeflow's initializer images (any registry, tag or digest) and the module they run.
_KUBEFLOW_IMAGE = re.compile(r"(^|/)(dataset|model)-initializer$")
_KUBEFLOW_MODULE = re.compile(r"^pkg\.initializers\.(dataset|model)$")


def kubeflow_initializer_kind(image: str) -> str:
    """``dataset`` / ``model`` when ``image`` is one of Kubeflow's initializer images, else ''.

    >>> kubeflow_initializer_kind("ghcr.io/kubeflow/trainer/model-initializer:v2.3.0")
    'model'
    """
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    match = _KUBEFLOW_IMAGE.search(name)
    return match.group(2) if match else ""


def kubeflow_module_to_ours(command: list[str]) -> list[str]:
    """``python -m pkg.initializers.dataset`` (the module of Kubeflow's images) as ``python -m
    trainjob.initializers dataset``; any other command unchanged."""
    out = list(command)
    for index, arg in enumerate(out[:-1]):
        if arg == "-m" and (match := _KUBEFLOW_MODULE.match(out[index + 1])):
            out[index + 1: index + 2] = ["trainjob.initializers", match.group(1)]
            break
    return out


@dataclass(frozen=True)
class Source:
    """A parsed storage URI: ``hf`` with ``repo_id`` (and ``revision``), or ``s3`` with ``bucket`` and ``prefix``."""

    uri: str
    scheme: str
    repo_id: str = ""
    revision: str | None = None
    bucket: str = ""
    prefix: str = ""


def parse_storage_uri(uri: str, kind: str) -> Source:
    """``uri`` split into what its provider needs; ``ValidationError`` naming what is wrong and what is accepted.

    >>> parse_storage_uri("hf://tatsu-lab/alpaca@v1", "dataset").repo_id
    'tatsu-lab/alpaca'
    >>> parse_storage_uri("s3://bucket/data/train", "dataset").prefix
    'data/train'
    """
    parsed = urlparse(uri)
    accepted = "hf://<owner>/<name>[@<revision>] or s3://<bucket>[/<prefix>]"
    if parsed.scheme == KUBEFLOW_CACHE_SCHEME:
        raise ValidationError(STORAGE_URI_ENV, f"{uri!r}: Kubeflow's distributed data cache (cache://) is not part "
                              f"of trainjob; use {accepted}")
    if parsed.scheme not in SCHEMES:
        raise ValidationError(STORAGE_URI_ENV, f"unknown scheme in {uri!r}; accepted: {accepted}")
    if parsed.scheme == S3_SCHEME:
        if not parsed.netloc:
            raise ValidationError(STORAGE_URI_ENV, f"{uri!r} names no bucket; expected s3://<bucket>[/<prefix>]")
        return Source(uri=uri, scheme=S3_SCHEME, bucket=parsed.netloc, prefix=parsed.path.lstrip("/"))
    parts = [p for p in f"{parsed.netloc}{parsed.path}".split("/") if p]
    # A dataset is <owner>/<name> (Kubeflow drops what follows); a model may also be a bare <name>.
    parts = parts[:2] if kind == DATASET else parts
    repo, _, revision = "/".join(parts).partition("@")
    if not repo or (kind == DATASET and len(parts) < 2):
        raise ValidationError(STORAGE_URI_ENV, f"{uri!r} names no repository; expected hf://<owner>/<name>"
                              "[@<revision>]")
    return Source(uri=uri, scheme=HF_SCHEME, repo_id=repo, revision=revision or None)


def _patterns(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(item.strip() for item in value.split(",") if item.strip())


@dataclass(frozen=True)
class InitializerConfig:
    """Everything one initializer run needs, from its environment (:meth:`from_env`)."""

    kind: str
    source: Source
    target: str
    access_token: str | None = None
    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    region: str | None = None
    role_arn: str | None = None
    ignore_patterns: tuple[str, ...] = ()
    allow_patterns: tuple[str, ...] | None = None
    cache_dir: str | None = None
    progress_file: str | None = None
    hf_endpoint: str | None = None

    @classmethod
    def from_env(cls, kind: str, environ: Mapping[str, str] | None = None) -> InitializerConfig:
        """The config of a ``kind`` initializer (``dataset`` or ``model``) from ``environ`` (default: this
        process's); ``ValidationError`` for a missing or bad ``STORAGE_URI``."""
        env = os.environ if environ is None else environ
        if kind not in KINDS:
            raise ValidationError("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
        uri = (env.get(STORAGE_URI_ENV) or "").strip()
        if not uri:
            raise ValidationError(STORAGE_URI_ENV, "is not set; the TrainJob's spec.initializer."
                                  f"{kind}.storageUri (or the runtime's env) sets it, e.g. hf://<owner>/<name>")
        source = parse_storage_uri(uri, kind)
        if env.get("REVISION"):
            source = Source(**{**source.__dict__, "revision": env["REVISION"]})
        ignore = _patterns(env.get("IGNORE_PATTERNS") or None)
        if ignore is None:
            ignore = MODEL_IGNORE_PATTERNS if kind == MODEL else ()
        allow = _patterns(env.get("ALLOW_PATTERNS") or None)
        if allow is None and kind == MODEL and source.scheme == HF_SCHEME:
            allow = HF_MODEL_ALLOW_PATTERNS
        if allow is not None and "*" in allow:
            allow = None
        return cls(
            kind=kind, source=source, target=env.get(TARGET_ENV) or DEFAULT_TARGETS[kind],
            access_token=env.get("ACCESS_TOKEN") or env.get("HF_TOKEN") or None,
            endpoint=env.get("ENDPOINT") or None, access_key_id=env.get("ACCESS_KEY_ID") or None,
            secret_access_key=env.get("SECRET_ACCESS_KEY") or None, region=env.get("REGION") or None,
            role_arn=env.get("ROLE_ARN") or None, ignore_patterns=ignore, allow_patterns=allow,
            cache_dir=env.get(CACHE_ENV) or None, progress_file=env.get(PROGRESS_ENV) or None,
            hf_endpoint=env.get("HF_ENDPOINT") or None,
        )

    def where(self) -> str:
        """The source as messages name it: its URI, and the server when it is not the default one."""
        server = self.endpoint if self.source.scheme == S3_SCHEME else self.hf_endpoint
        return f"{self.source.uri} (at {server})" if server else self.source.uri
