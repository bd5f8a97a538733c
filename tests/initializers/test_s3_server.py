"""The S3 test server (VersityGW over a posix folder, :mod:`objectstore.s3`) behaves as the real boto3 client
expects of S3: round trips, prefix listing, refusals with the right HTTP status, and the transfer manager's ranged
and multipart transfers. The initializers' S3 tests rely on each of these."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobtest.tiers import starts
from objectstore.s3 import S3Server, require_s3_server

BUCKET = "checks"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
@starts("procs")
def s3() -> Iterator[S3Server]:
    """One server for the module, with bucket ``checks``."""
    binary = require_s3_server()
    with S3Server(binary=binary) as server:
        server.make_bucket(BUCKET)
        yield server


def _status(error: Any) -> int:
    return int(error.response["ResponseMetadata"]["HTTPStatusCode"])


def test_put_get_round_trip_lands_in_the_posix_folder(s3: S3Server) -> None:
    data = b"weights\x00\xff" * 1000
    s3.put(BUCKET, "models/tiny/model.bin", data)
    got = s3.client().get_object(Bucket=BUCKET, Key="models/tiny/model.bin")
    assert got["Body"].read() == data
    assert got["ContentLength"] == len(data)
    assert got["ETag"].strip('"') == hashlib.md5(data).hexdigest()
    assert (s3.root / BUCKET / "models" / "tiny" / "model.bin").read_bytes() == data


def test_list_objects_v2_with_prefix_and_delimiter(s3: S3Server) -> None:
    for key in ["ds/train/0.parquet", "ds/train/1.parquet", "ds/test/0.parquet", "dsx/other", "readme"]:
        s3.put(BUCKET, key, key.encode())
    client = s3.client()
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix="ds/train/")
    assert [item["Key"] for item in listed["Contents"]] == ["ds/train/0.parquet", "ds/train/1.parquet"]
    assert [item["Size"] for item in listed["Contents"]] == [len("ds/train/0.parquet")] * 2
    folders = client.list_objects_v2(Bucket=BUCKET, Prefix="ds/", Delimiter="/")
    assert [p["Prefix"] for p in folders["CommonPrefixes"]] == ["ds/test/", "ds/train/"]
    assert "Contents" not in folders
    paged = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="ds/", PaginationConfig={
        "PageSize": 1})
    assert [item["Key"] for page in paged for item in page.get("Contents", [])] == [
        "ds/test/0.parquet", "ds/train/0.parquet", "ds/train/1.parquet"]


def test_a_wrong_secret_is_refused_with_403(s3: S3Server) -> None:
    from botocore.exceptions import ClientError

    s3.put(BUCKET, "secret.txt", b"x")
    wrong = s3.client(secret_key="not-the-secret")
    with pytest.raises(ClientError) as refused:
        wrong.get_object(Bucket=BUCKET, Key="secret.txt")
    assert _status(refused.value) == 403
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    unknown = s3.client(access_key="nobody-here", secret_key="whatever")
    with pytest.raises(ClientError) as refused:
        unknown.list_objects_v2(Bucket=BUCKET)
    assert _status(refused.value) == 403
    assert refused.value.response["Error"]["Code"] == "InvalidAccessKeyId"


def test_an_account_without_rights_on_the_bucket_is_refused_with_403(s3: S3Server) -> None:
    from botocore.exceptions import ClientError

    s3.put(BUCKET, "private.txt", b"x")
    outsider = s3.outsider_client()
    for call in (lambda: outsider.get_object(Bucket=BUCKET, Key="private.txt"),
                 lambda: outsider.list_objects_v2(Bucket=BUCKET)):
        with pytest.raises(ClientError) as refused:
            call()
        assert _status(refused.value) == 403
        assert refused.value.response["Error"]["Code"] == "AccessDenied"


def test_a_missing_key_is_404(s3: S3Server) -> None:
    from botocore.exceptions import ClientError

    client = s3.client()
    with pytest.raises(ClientError) as missing:
        client.get_object(Bucket=BUCKET, Key="no/such/key")
    assert _status(missing.value) == 404
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(ClientError) as missing:
        client.head_object(Bucket=BUCKET, Key="no/such/key")
    assert _status(missing.value) == 404
    with pytest.raises(ClientError) as missing:
        client.list_objects_v2(Bucket="no-such-bucket")
    assert _status(missing.value) == 404
    assert missing.value.response["Error"]["Code"] == "NoSuchBucket"


def test_range_get(s3: S3Server) -> None:
    data = bytes(range(256)) * 16
    s3.put(BUCKET, "ranged.bin", data)
    got = s3.client().get_object(Bucket=BUCKET, Key="ranged.bin", Range="bytes=100-355")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["ContentRange"] == f"bytes 100-355/{len(data)}"
    assert got["Body"].read() == data[100:356]


def test_transfer_manager_download_of_5_mib_is_identical(s3: S3Server, tmp_path: Path) -> None:
    data = os.urandom(5 * MiB)
    s3.put(BUCKET, "big/5mib.bin", data)
    target = tmp_path / "5mib.bin"
    s3.client().download_file(BUCKET, "big/5mib.bin", str(target))
    assert target.read_bytes() == data


def test_transfer_manager_multipart_upload_and_ranged_download(s3: S3Server, tmp_path: Path) -> None:
    """Above the threshold the upload is a multipart upload in 5 MiB parts (s3transfer raises smaller part sizes to
    S3's minimum, 5 MiB), whose ETag has S3's form ``md5(part md5s)-N``; with 1 MiB chunks the download is six
    concurrent ranged GETs."""
    from boto3.s3.transfer import TransferConfig

    data = os.urandom(5 * MiB + 12345)
    small_parts = TransferConfig(multipart_threshold=MiB, multipart_chunksize=MiB, max_concurrency=4)
    client = s3.client()
    client.upload_fileobj(io.BytesIO(data), BUCKET, "big/multipart.bin", Config=small_parts)
    head = client.head_object(Bucket=BUCKET, Key="big/multipart.bin")
    assert head["ContentLength"] == len(data)
    parts = [data[i:i + 5 * MiB] for i in range(0, len(data), 5 * MiB)]
    assert len(parts) == 2
    expected = hashlib.md5(b"".join(hashlib.md5(part).digest() for part in parts)).hexdigest()
    assert head["ETag"].strip('"') == f"{expected}-{len(parts)}"
    target = tmp_path / "multipart.bin"
    client.download_file(BUCKET, "big/multipart.bin", str(target), Config=small_parts)
    assert target.read_bytes() == data
