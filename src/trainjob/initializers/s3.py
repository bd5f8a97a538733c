"""``s3://`` sources: the objects under a prefix of a bucket, through boto3 (any S3-compatible server).

The objects are listed once (``ListObjectsV2``: key, size, ETag); the version the cache keys on is a digest of
that listing, so a changed object is a new version. Each object is streamed into ``NAME.part`` (one GET), its size
and MD5 (when its ETag is a single-part upload's MD5) checked, and renamed; several objects are fetched at once.
Files an earlier, stopped run left are checked the same way and kept, or fetched again.
A dropped connection is tried again (a few times, from the file's start); a refusal (403, 404, bad credentials)
is not.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from trainjob.errors import DownloadError
from trainjob.initializers.config import InitializerConfig
from trainjob.initializers.transfer import PART_SUFFIX, Listing, RemoteFile, is_verified, verify_file

#: Objects fetched at once.
PARALLEL_FILES = 8
#: Tries of one object when its transfer breaks off.
FILE_ATTEMPTS = 3
CHUNK_BYTES = 1 << 20
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_REGION = "us-east-1"


class S3Source:
    """A prefix of an S3 bucket: :meth:`list` it, then :meth:`fetch` a listing of it into a folder."""

    def __init__(self, config: InitializerConfig) -> None:
        self.config = config
        self.bucket = config.source.bucket
        self.prefix = config.source.prefix
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        import boto3
        from botocore.config import Config

        config = self.config
        credentials: dict[str, str] = {}
        if config.access_key_id and config.secret_access_key:
            credentials = {"aws_access_key_id": config.access_key_id,
                           "aws_secret_access_key": config.secret_access_key}
        session = boto3.session.Session(region_name=config.region or DEFAULT_REGION, **credentials)
        if config.role_arn:
            sts = session.client("sts", endpoint_url=config.endpoint or None)
            try:
                assumed = sts.assume_role(RoleArn=config.role_arn, RoleSessionName="trainjob-initializer")
            except Exception as exc:
                raise self._error(exc, f"assuming role {config.role_arn}") from exc
            keys = assumed["Credentials"]
            session = boto3.session.Session(
                region_name=config.region or DEFAULT_REGION, aws_access_key_id=keys["AccessKeyId"],
                aws_secret_access_key=keys["SecretAccessKey"], aws_session_token=keys["SessionToken"])
        client_config = Config(max_pool_connections=PARALLEL_FILES * 2, retries={"max_attempts": 3, "mode": "standard"},
                               s3={"addressing_style": "path"} if config.endpoint else {})
        return session.client("s3", endpoint_url=config.endpoint or None, config=client_config)

    def list(self) -> Listing:
        files: list[RemoteFile] = []
        etags: list[tuple[str, int, str]] = []
        try:
            pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for item in page.get("Contents") or []:
                    key, size, etag = item["Key"], int(item["Size"]), item.get("ETag", "").strip('"')
                    relative = self._relative(key)
                    if key.endswith("/") or relative is None or self._ignored(key, relative):
                        continue
                    etags.append((key, size, etag))
                    checksum = ("md5", etag) if _MD5_ETAG.match(etag) else None
                    files.append(RemoteFile(path=relative, size=size, checksum=checksum, key=key))
        except DownloadError:
            raise
        except Exception as exc:
            raise self._error(exc, "listing") from exc
        if not files:
            raise DownloadError(f"{self.config.where()}: no objects under s3://{self.bucket}/{self.prefix}"
                                + (f" once {', '.join(self.config.ignore_patterns)} are ignored"
                                   if self.config.ignore_patterns else ""))
        version = hashlib.sha256(json.dumps(sorted(etags)).encode()).hexdigest()
        return Listing(version=version, files=tuple(files))

    def _relative(self, key: str) -> str | None:
        """The object's path under the target: the key less the prefix (the file name for a prefix that is the
        key itself, as Kubeflow does); ``None`` for a key that would climb out of it."""
        relative = key[len(self.prefix):].lstrip("/") or PurePosixPath(key).name
        parts = PurePosixPath(relative).parts
        if ".." in parts or relative.startswith("/"):
            return None
        return relative

    def _ignored(self, key: str, relative: str) -> bool:
        """A pattern may match the key (as Kubeflow's initializer matches it), the path under the target (as the
        Hub's patterns match), or the file's name."""
        names = (key, relative, PurePosixPath(key).name)
        return any(fnmatch.fnmatch(name, p) for p in self.config.ignore_patterns for name in names)

    def fetch(self, listing: Listing, staging: Path) -> None:
        with ThreadPoolExecutor(max_workers=PARALLEL_FILES, thread_name_prefix="s3-fetch") as pool:
            for _ in pool.map(lambda f: self._keep_or_fetch(f, staging / f.path), listing.files):
                pass

    def _keep_or_fetch(self, remote: RemoteFile, path: Path) -> None:
        """A file an earlier run left is kept if it checks out; anything else is fetched."""
        if is_verified(path, remote):
            try:
                verify_file(path, remote, self.config.where())
                return
            except DownloadError:
                path.unlink(missing_ok=True)
        self._fetch_file(remote.key or remote.path, remote, path)

    def _fetch_file(self, key: str, remote: RemoteFile, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + PART_SUFFIX)
        for attempt in range(1, FILE_ATTEMPTS + 1):
            try:
                self._stream(key, part, remote)
                verify_file(part, remote, self.config.where())
                os.replace(part, path)
                return
            except DownloadError as exc:
                part.unlink(missing_ok=True)
                if not exc.retryable or attempt == FILE_ATTEMPTS:
                    raise
            except OSError as exc:
                part.unlink(missing_ok=True)
                if exc.errno is not None:  # a local error (a full disk): not the server's
                    raise
                if attempt == FILE_ATTEMPTS:
                    raise self._error(exc, f"reading {key}") from exc
            except Exception as exc:
                part.unlink(missing_ok=True)
                error = self._error(exc, f"reading {key}")
                if not error.retryable or attempt == FILE_ATTEMPTS:
                    raise error from exc

    def _stream(self, key: str, part: Path, remote: RemoteFile) -> None:
        body = self.client().get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            with part.open("wb") as handle:
                shutil.copyfileobj(body, handle, CHUNK_BYTES)
        finally:
            body.close()
        if remote.size != part.stat().st_size:
            raise DownloadError(f"{self.config.where()}: the connection closed after {part.stat().st_size} of "
                                f"{remote.size} bytes of {key}", retryable=True)

    def _error(self, exc: BaseException, doing: str) -> DownloadError:
        """boto3's exception as a message naming the URI, the server's answer and whether to try again."""
        where = self.config.where()
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and "Error" in response:
            error = response.get("Error") or {}
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            code, message = error.get("Code", ""), error.get("Message", "")
            hint = ""
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
                hint = "; check ACCESS_KEY_ID / SECRET_ACCESS_KEY (or the role) and the bucket's policy"
            elif code in ("NoSuchBucket",):
                hint = f"; bucket {self.bucket!r} does not exist at this endpoint"
            elif code in ("NoSuchKey", "404"):
                hint = "; the object is gone (it was listed a moment ago)"
            retryable = bool(status and int(status) >= 500)
            return DownloadError(f"{where}: {doing}: {status} {code} {message}".rstrip() + hint, retryable=retryable)
        from botocore.exceptions import NoCredentialsError

        if isinstance(exc, NoCredentialsError):
            return DownloadError(f"{where}: {doing}: no credentials; set ACCESS_KEY_ID and SECRET_ACCESS_KEY (the "
                                 "initializer's env or spec.initializer.*.secretRef)")
        return DownloadError(f"{where}: {doing}: {type(exc).__name__}: {exc}", retryable=True)
