"""A real S3-compatible server for tests: VersityGW (``github.com/versity/versitygw``), built from its Go module at
the version ``scripts/s3server/go.mod`` pins, serving a posix folder (every folder under :attr:`S3Server.root` is a
bucket, every file below it an object). The real ``boto3`` talks to it over HTTP on 127.0.0.1, SigV4 included::

    require_s3_server()                    # skip with the reason, or fail under TRAINJOB_REQUIRE_CLUSTER=1
    with S3Server() as s3:
        s3.make_bucket("models")
        s3.put("models", "bert/config.json", b"{}")
        s3.client().get_object(Bucket="models", Key="bert/config.json")

The first build takes about 1.5 minutes on 2 cores; later ones find the binary in the cache in milliseconds.
"""

from __future__ import annotations

import atexit
import functools
import http.client
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = [
    "BUILD_SCRIPT", "REQUIRE_ENV", "S3Server", "require_s3_server", "s3_server_unavailable", "versitygw_binary",
]

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "scripts" / "s3server" / "build.sh"
#: CI sets it to 1: there the S3 tests must run, so a missing Go fails them instead of skipping them.
REQUIRE_ENV = "TRAINJOB_REQUIRE_CLUSTER"
#: Environment variables that VersityGW reads as flags: dropped from its environment so that the host's settings
#: (a read-only gateway, another IAM backend, another root account) cannot change the server the tests see.
_VERSITYGW_ENV_PREFIXES = ("VGW_", "ROOT_ACCESS_KEY", "ROOT_SECRET", "LOGFILE", "WEBHOOK")


@functools.cache
def versitygw_binary() -> Path:
    """The VersityGW binary, built by ``scripts/s3server/build.sh`` on first use (cached across runs by the pins
    and the Go version). ``LookupError`` when Go is not on PATH; ``RuntimeError`` when the build fails (that is a
    real failure, not a reason to skip)."""
    if shutil.which("go") is None:
        raise LookupError("the S3 test server (VersityGW) is built from its Go module and needs Go (https://go.dev/dl/)")
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/s3server/build.sh failed ({done.returncode}): {done.stderr.strip()[-3000:]}")
    path = Path(done.stdout.strip().splitlines()[-1])
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"scripts/s3server/build.sh printed {path}, which is not an executable")
    return path


def s3_server_unavailable() -> str | None:
    """Why the S3 tests cannot run here (no Go to build the server, no boto3 to talk to it), or ``None``."""
    if shutil.which("go") is None:
        return "the S3 test server (VersityGW) is built from its Go module and needs Go (https://go.dev/dl/)"
    try:
        import boto3  # noqa: F401
    except ImportError:
        return "the boto3 package is not installed (pip install -e '.[dev]')"
    return None


def require_s3_server() -> Path:
    """The VersityGW binary (built if need be). Skips the calling test with the reason when it cannot be had here;
    fails it instead under ``TRAINJOB_REQUIRE_CLUSTER=1``, where Go is required."""
    import pytest

    reason = s3_server_unavailable()
    if reason is None:
        try:
            return versitygw_binary()
        except LookupError as error:
            reason = str(error)
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3Server:
    """VersityGW with its posix backend over a folder, on a free port of 127.0.0.1, for as long as the ``with``
    block lasts; the process is stopped (SIGTERM, then SIGKILL after 10 s) and reaped on exit.

    Two accounts: the root account (:attr:`access_key`, :attr:`secret_key`), which owns every bucket the tests make,
    and an *outsider* (:attr:`outsider_access_key`, :attr:`outsider_secret_key`), a plain user of VersityGW's
    internal IAM with no rights on those buckets: its requests are signed correctly and still refused (403
    AccessDenied), as a real store refuses a job whose credentials lack the bucket.

    ``directory`` holds ``root/`` (the buckets), ``iam/`` and ``versitygw.log``; a temporary folder, removed on exit,
    when not given.
    """

    region = "us-east-1"

    def __init__(
        self,
        directory: Path | None = None,
        *,
        access_key: str = "trainjob-test-root",
        secret_key: str = "trainjob-test-root-secret",
        outsider_access_key: str = "trainjob-test-outsider",
        outsider_secret_key: str = "trainjob-test-outsider-secret",
        binary: Path | None = None,
        startup_timeout: float = 30.0,
        host: str = "127.0.0.1",
    ) -> None:
        #: The address it listens on (a node's pods reach this host at its InternalIP, not at 127.0.0.1).
        self.host = host
        self.access_key = access_key
        self.secret_key = secret_key
        self.outsider_access_key = outsider_access_key
        self.outsider_secret_key = outsider_secret_key
        self._binary = binary
        self._startup_timeout = startup_timeout
        self._given_directory = directory
        self._directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._client: Any = None
        self.port = 0

    # -- where it is --------------------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The folder with ``root/``, ``iam/`` and the server's log (only while the server runs)."""
        if self._directory is None:
            raise RuntimeError("the S3 server is not running; use it as a context manager")
        return self._directory

    @property
    def root(self) -> Path:
        """The posix backend's top folder: each folder in it is a bucket, each file below that an object."""
        return self.directory / "root"

    @property
    def log_path(self) -> Path:
        """VersityGW's stdout and stderr (its banner, one line per request, errors)."""
        return self.directory / "versitygw.log"

    @property
    def endpoint(self) -> str:
        """``http://HOST:PORT``, what a client's ``endpoint_url`` (or ``AWS_ENDPOINT_URL``) is set to."""
        return f"http://{self.host}:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log, for failure messages."""
        try:
            return self.log_path.read_bytes()[-chars:].decode(errors="replace")
        except OSError:
            return ""

    # -- start and stop -----------------------------------------------------------------------------------------

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until it answers HTTP. A port taken between picking and binding it (another
        process won the race) is retried on a new one."""
        if self._process is not None:
            raise RuntimeError("the S3 server is already running")
        binary = self._binary or versitygw_binary()
        if self._given_directory is not None:
            self._directory = self._given_directory
            self._directory.mkdir(parents=True, exist_ok=True)
        else:
            self._directory = Path(tempfile.mkdtemp(prefix="trainjob-s3-"))
        try:
            self.root.mkdir(exist_ok=True)
            self._write_iam()
            for attempt in range(3):
                self._launch(binary)
                try:
                    self._wait_until_ready()
                    break
                except _PortTaken:
                    self._reap()
                    if attempt == 2:
                        raise
            atexit.register(self.stop)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 10 s), reap it, and remove its temporary folder. Idempotent."""
        atexit.unregister(self.stop)
        self._reap()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._given_directory is None and self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
        self._directory = None

    def _write_iam(self) -> None:
        """VersityGW's internal IAM (``--iam-dir``) reads its accounts from ``users.json``: the outsider is written
        there before the server starts, so no admin call is needed. Role ``user`` can only reach buckets it owns or
        that grant it access."""
        import json

        iam = self.directory / "iam"
        iam.mkdir(exist_ok=True)
        outsider = {
            "access": self.outsider_access_key, "secret": self.outsider_secret_key, "role": "user",
            "userID": 0, "groupID": 0, "projectID": 0,
        }
        (iam / "users.json").write_text(json.dumps({"accessAccounts": {self.outsider_access_key: outsider}}))

    def _launch(self, binary: Path) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(_VERSITYGW_ENV_PREFIXES)}
        command = [
            str(binary),
            "--access", self.access_key, "--secret", self.secret_key, "--region", self.region,
            "--port", f"{self.host}:{self.port}", "--iam-dir", str(self.directory / "iam"),
            "posix", str(self.root),
        ]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - held for the life of the process
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env,
            cwd=self.directory,
        )

    def _wait_until_ready(self) -> None:
        """Poll until an HTTP request gets any answer (an anonymous ``GET /`` gets 403: that is an answer)."""
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                tail = self.log_tail()
                if "address already in use" in tail:
                    raise _PortTaken(tail)
                raise RuntimeError(f"versitygw exited with {code} before it answered on {self.endpoint}:\n{tail}")
            connection = http.client.HTTPConnection(self.host, self.port, timeout=2)
            try:
                connection.request("GET", "/")
                connection.getresponse().read()
                return
            except OSError:
                pass
            finally:
                connection.close()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"versitygw did not answer on {self.endpoint} within {self._startup_timeout:g} s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)

    def _reap(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    # -- clients ------------------------------------------------------------------------------------------------

    def client(self, *, access_key: str | None = None, secret_key: str | None = None, **config: Any) -> Any:
        """A boto3 S3 client for this server (path-style addressing, SigV4, this region), as the root account unless
        other keys are given. ``config`` goes to ``botocore.config.Config`` (e.g. ``retries``). With no
        arguments, one client is kept and returned each time. ``signature_version`` is ``s3v4`` because VersityGW
        accepts SigV4 only, and boto3 otherwise presigns URLs for a custom endpoint with SigV2 (which it refuses
        with 400 InvalidRequest)."""
        import boto3
        from botocore.config import Config

        shared = access_key is None and secret_key is None and not config
        if shared and self._client is not None:
            return self._client
        settings: dict[str, Any] = {
            "s3": {"addressing_style": "path"}, "signature_version": "s3v4", "retries": {"max_attempts": 2},
        }
        settings.update(config)
        made = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name=self.region,
            config=Config(**settings),
        )
        if shared:
            self._client = made
        return made

    def outsider_client(self, **config: Any) -> Any:
        """A client signed as the outsider: valid credentials without rights on the root account's buckets."""
        return self.client(access_key=self.outsider_access_key, secret_key=self.outsider_secret_key, **config)

    def client_env(self) -> dict[str, str]:
        """The environment that points a subprocess's AWS SDK (boto3, the AWS CLI) at this server as root. An IP
        endpoint makes botocore use path-style addressing by itself."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region,
        }

    def make_bucket(self, name: str) -> None:
        """Create bucket ``name`` (owned by the root account)."""
        self.client().create_bucket(Bucket=name)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        """Store ``data`` as ``bucket/key`` with one PutObject."""
        self.client().put_object(Bucket=bucket, Key=key, Body=data)


class _PortTaken(RuntimeError):
    """The port picked for the server was bound by someone else before the server could bind it."""
