"""The test cluster's images: built here with buildah, served by a registry on loopback, pulled by the nodes.

Nothing can be pulled from outside, so every image is built on this machine, each the way its project ships it:

- ``debian-python``: Debian bookworm from ``debootstrap --variant=minbase`` with Python 3.11 and its venv module, the
  stand-in base for ``python:3.11-slim`` (the training Dockerfile's default ``BASE``);
- ``pause``: the sandbox image, Kubernetes' own ``build/pause/linux/pause.c`` built static by
  ``scripts/cluster/build.sh``;
- ``coredns``: the cluster DNS, CoreDNS's static binary (``scripts/cluster/build.sh``);
- ``trainjob-train``: ``deploy/training.Dockerfile`` on the repo, as users build it (torch and trainjob at the lock's
  versions, the examples), with Ray for the ray-distributed runtime too;
- ``trainjob-operator``: ``deploy/Dockerfile``, the operator;
- ``trainjob-stacks``: ``deploy/stacks.Dockerfile``, py-spy for ``trainjob stacks --debug-image``.

Each image is tagged by a hash of what goes into it, kept in buildah's storage and in the registry's
(``$TRAINJOB_IMAGE_CACHE``, by default ``~/.cache/trainjob/images``), and built again only when that hash is new::

    with Registry.start(cache_dir() / "registry", logs) as registry:
        images = build_images(registry, components)      # {"trainjob-train": "registry.trainjob.test/...:<hash>", ...}

Pods name images at :data:`REGISTRY_HOST`; each node's containerd maps that name to the loopback registry
(``hosts.toml``), as a cluster maps its registry's name to a mirror.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
#: The registry name in every image reference of the test cluster.
REGISTRY_HOST = "registry.trainjob.test"
TRAINING_DOCKERFILE = REPO / "deploy" / "training.Dockerfile"
#: What debootstrap installs into the base: what ``python:3.11-slim`` has that the Dockerfile uses.
BASE_PACKAGES = ["python3", "python3-venv", "python-is-python3", "ca-certificates", "netbase", "procps"]
DEBIAN_MIRROR = os.environ.get("TRAINJOB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
#: The optional dependencies the test cluster's training image adds: the examples', and Ray for the
#: ray-distributed runtime's test.
TRAINING_EXTRAS = "examples,initializers,ray"
#: What the training image's context holds (the rest of the repo is left out by .dockerignore).
TRAINING_INPUTS = ["deploy/training.Dockerfile", "requirements/dev.lock", "pyproject.toml", "README.md", "src",
                   "examples", ".dockerignore"]
STACKS_DOCKERFILE = REPO / "deploy" / "stacks.Dockerfile"
OPERATOR_DOCKERFILE = REPO / "deploy" / "Dockerfile"
#: What the operator image's context holds.
OPERATOR_INPUTS = ["deploy/Dockerfile", "requirements/dev.lock", "pyproject.toml", "README.md", "src", ".dockerignore"]


def htpasswd_line(user: str, password: str) -> str:
    """An htpasswd entry with a bcrypt hash, the only kind the registry accepts (libcrypt's, through :mod:`crypt`)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return f"{user}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n"


def local_reference(reference: str) -> str:
    """The buildah-local name of an image the test registry serves as ``reference``."""
    return reference.replace(f"{REGISTRY_HOST}/trainjob/", "localhost/trainjob-test/")


def cache_dir() -> Path:
    path = Path(os.environ.get("TRAINJOB_IMAGE_CACHE", Path.home() / ".cache" / "trainjob" / "images"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(argv: list[str], what: str, timeout: float = 1800, **kwargs: Any) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}): {' '.join(argv)}\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return done.stdout


def _hash_paths(paths: list[Path], extra: str = "") -> str:
    """A short hash of files and folders (names and contents; compiled bytecode left out) and ``extra``."""
    digest = hashlib.sha256(extra.encode())
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            digest.update(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path.name).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _dependency_lists() -> str:
    """pyproject.toml's dependencies and optional dependencies, what the Dockerfiles' first layer is made of."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return json.dumps([project.get("dependencies", []), project.get("optional-dependencies", {})], sort_keys=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time per cache (a test session and a benchmark may start together)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _port_of(storage: Path) -> int:
    """The port the registry serving ``storage`` used last (kept beside it), if it is free; else a free one, kept.

    buildah pushes every layer gzip-compressed whatever ``--disable-compression`` says (containers/image compresses
    for a registry destination), several minutes of one core for the training image's GBs, and skips a layer only
    where its blob info cache (``/var/lib/containers/cache``) knows the compressed copy is at that registry: at that
    address. On the same address at every session, a new training image (src/ changed) uploads its small top layer
    only: measured 0.2 s instead of 111 s for the unchanged image, against a registry on a new port each time."""
    from trainjob.ports import free_port, is_free  # noqa: PLC0415

    record = storage.parent / f"{storage.name}.port"
    with contextlib.suppress(OSError, ValueError):
        port = int(record.read_text())
        if is_free("127.0.0.1", port, reuse_address=True):  # as the registry (Go) binds it
            return port
    port = free_port()
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(f"{port}\n")
    return port


class Registry:
    """Debian's ``docker-registry`` (the CNCF Distribution registry) on ``127.0.0.1:<port>``; its storage lasts
    across test sessions, so an image pushed once is there for every later cluster, and so does its port
    (:func:`_port_of`)."""

    def __init__(self, storage: Path, log: Path) -> None:
        self.storage = storage
        self.port = _port_of(storage)
        self.log = log
        self.config = log.parent / "registry.yaml"
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    def start(cls, storage: Path, log: Path, htpasswd: Path | None = None) -> Registry:
        """Serve ``storage``; with ``htpasswd`` (bcrypt entries, see :func:`htpasswd_line`) every request needs
        basic authentication, as a private registry does."""
        binary = shutil.which("docker-registry")
        if binary is None:
            raise RuntimeError("docker-registry is not installed (Debian's docker-registry; scripts/setup.sh "
                               "installs it)")
        registry = cls(storage, log)
        storage.mkdir(parents=True, exist_ok=True)
        config = log.parent / "registry.yaml"
        registry.config = config
        config.write_text(yaml.safe_dump({
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
            "http": {"addr": registry.address},
            **({"auth": {"htpasswd": {"realm": "trainjob-test", "path": str(htpasswd)}}} if htpasswd else {}),
        }))
        with log.open("ab") as out:
            # Blobs of the tags deleted before (older builds) go, unless another registry serves this storage now.
            collect = storage / ".collect"
            if collect.exists() and subprocess.run(["pgrep", "-f", "docker-registry serve"],
                                                   capture_output=True).returncode != 0:
                subprocess.run([binary, "garbage-collect", "--delete-untagged", str(config)], stdout=out,
                               stderr=subprocess.STDOUT, timeout=600)
                collect.unlink()
            registry.popen = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if registry.popen.poll() is not None:
                raise RuntimeError(f"docker-registry exited {registry.popen.returncode}:\n{log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://{registry.address}/v2/", timeout=2):
                    return registry
            except urllib.error.HTTPError as exc:  # 401: it answers, and asks who is there
                if exc.code == 401 and htpasswd is not None:
                    return registry
            except OSError:
                pass
            time.sleep(0.1)
        registry.stop()
        raise TimeoutError(f"docker-registry did not answer on {registry.address}")

    def has(self, repository: str, tag: str) -> bool:
        request = urllib.request.Request(
            f"http://{self.address}/v2/{repository}/manifests/{tag}", method="HEAD",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                return True
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise

    def forget_other_tags(self, repository: str, keep: str) -> None:
        """Delete every tag of ``repository`` but ``keep`` (their blobs go at the next start's garbage collection)."""
        with urllib.request.urlopen(f"http://{self.address}/v2/{repository}/tags/list", timeout=10) as answer:
            tags = json.loads(answer.read()).get("tags") or []
        kept = self._digest(repository, keep)
        for tag in tags:
            digest = self._digest(repository, tag)
            # a manifest is deleted by digest, with every tag on it: never the kept one's
            if tag == keep or digest is None or digest == kept:
                continue
            delete = urllib.request.Request(f"http://{self.address}/v2/{repository}/manifests/{digest}",
                                            method="DELETE")
            with contextlib.suppress(urllib.error.HTTPError), urllib.request.urlopen(delete, timeout=10):
                (self.storage / ".collect").touch()  # the next start collects its blobs

    def _digest(self, repository: str, tag: str) -> str | None:
        head = urllib.request.Request(
            f"http://{self.address}/v2/{repository}/manifests/{tag}", method="HEAD",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                               "application/vnd.docker.distribution.manifest.v2+json"})
        try:
            with urllib.request.urlopen(head, timeout=10) as answer:
                return answer.headers["Docker-Content-Digest"]
        except urllib.error.HTTPError:
            return None

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Builder:
    """buildah with its storage under the image cache."""

    cache: Path
    log: Path

    def buildah(self, *args: str, what: str = "buildah", timeout: float = 3600, input: str | None = None) -> str:
        """Run buildah on this cache's storage; ``input``: its standard input (``login --password-stdin``)."""
        storage = self.cache / "buildah"
        argv = ["buildah", f"--root={storage / 'storage'}", f"--runroot={storage / 'run'}",
                "--storage-driver=overlay", *args]
        with self.log.open("a") as out:
            out.write(f"$ {' '.join(argv)}\n")
        return _run(argv, what, timeout=timeout, env={**os.environ, "BUILDAH_ISOLATION": "chroot"}, input=input)

    def exists(self, reference: str) -> bool:
        storage = self.cache / "buildah"
        return subprocess.run(
            ["buildah", f"--root={storage / 'storage'}", f"--runroot={storage / 'run'}", "--storage-driver=overlay",
             "inspect", "--type=image", reference], capture_output=True,
        ).returncode == 0

    def push(self, local: str, registry: Registry, remote: str) -> None:
        # --disable-compression is what we want (the registry and the nodes are on this disk), but buildah's
        # containers/image gzips every layer for a registry regardless; a layer the registry already has at this
        # address (its blob info cache says so) is skipped, which is why the cache's registry keeps its port.
        self.buildah("push", "--tls-verify=false", "--disable-compression", "--quiet", local,
                     f"docker://{registry.address}/{remote}", what=f"pushing {local}")

    @staticmethod
    def base_reference() -> str:
        stamp = hashlib.sha256(" ".join([*BASE_PACKAGES, DEBIAN_MIRROR]).encode()).hexdigest()[:12]
        return f"localhost/trainjob-test/debian-python:bookworm-{stamp}"

    def base(self) -> str:
        """The Debian base with Python 3.11 (debootstrap), committed once per package list."""
        reference = self.base_reference()
        if self.exists(reference):
            return reference
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            rootfs = Path(tmp) / "rootfs"
            _run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm",
                  str(rootfs), DEBIAN_MIRROR], "debootstrap", timeout=1200)
            shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            (rootfs / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
            container = self.buildah("from", "scratch", what="buildah from scratch").strip()
            try:
                mount = self.buildah("mount", container).strip()
                _run(["bash", "-c", f"tar --numeric-owner -C {rootfs} -cf - . | tar --numeric-owner -C {mount} -xpf -"],
                     "copying the base's root file system")
                self.buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                             "--env", "LANG=C.UTF-8", "--cmd", "python3", container)
                self.buildah("commit", "--quiet", container, reference, what="committing the base")
            finally:
                self.buildah("rm", container)
        return reference

    def from_binary(self, name: str, binary: Path, user: str | None = None) -> str:
        """A ``FROM scratch`` image of one static binary, its entry point."""
        tag = _hash_paths([binary], extra=f"{name}:{user}")
        reference = f"localhost/trainjob-test/{name}:{tag}"
        if self.exists(reference):
            return reference
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            shutil.copy(binary, Path(tmp) / name)
            lines = ["FROM scratch", f"COPY {name} /{name}", *([f"USER {user}"] if user else []),
                     f'ENTRYPOINT ["/{name}"]']
            (Path(tmp) / "Containerfile").write_text("\n".join(lines) + "\n")
            self.buildah("bud", "--quiet", "--pull-never", "-f", str(Path(tmp) / "Containerfile"), "-t", reference,
                         tmp, what=f"building the {name} image")
        return reference

    def training(self, base: str) -> str:
        """The training image (``deploy/training.Dockerfile`` with :data:`TRAINING_EXTRAS`) on ``base``."""
        return self._dockerfile("trainjob-train", TRAINING_DOCKERFILE, TRAINING_INPUTS, base,
                                {"EXTRAS": TRAINING_EXTRAS})

    def stacks(self, base: str) -> str:
        """The stack dumper (``deploy/stacks.Dockerfile``: py-spy) on ``base``, for ``trainjob stacks --debug-image``."""
        return self._dockerfile("trainjob-stacks", STACKS_DOCKERFILE, ["deploy/stacks.Dockerfile"], base, {})

    def operator(self, base: str) -> str:
        """The operator image (``deploy/Dockerfile``) on ``base``."""
        return self._dockerfile("trainjob-operator", OPERATOR_DOCKERFILE, OPERATOR_INPUTS, base, {})

    def training_reference(self) -> str:
        """The training image's local reference as :meth:`training` tags it, built or not."""
        return _dockerfile_reference("trainjob-train", TRAINING_INPUTS, self.base_reference(),
                                     {"EXTRAS": TRAINING_EXTRAS})

    def storage_conf(self, path: Path) -> Path:
        """A containers-storage config (``CONTAINERS_STORAGE_CONF``) with which Podman finds this cache's images."""
        storage = self.cache / "buildah"
        path.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{storage / "storage"}"\n'
                        f'runroot = "{storage / "run"}"\n')
        return path

    def _dockerfile(self, name: str, dockerfile: Path, inputs: list[str], base: str, args: dict[str, str]) -> str:
        """``dockerfile`` built on ``base`` with the repository as its context, tagged by a hash of ``inputs``."""
        extra = " ".join([base, *(f"{k}={v}" for k, v in sorted(args.items()))])
        reference = _dockerfile_reference(name, inputs, base, args)
        if self.exists(reference):
            return reference
        # A new dependency layer (GBs for the training image) is built when the lock, pyproject.toml's dependency
        # lists or the Dockerfile change (any other edit to pyproject.toml reuses it): the older images and their
        # build cache go first, or each such change would keep another copy on this disk.
        deps = _hash_paths([REPO / "requirements/dev.lock", dockerfile], extra=f"{extra} {_dependency_lists()}")
        stamp = self.cache / "buildah" / f"{name}-deps"
        if stamp.exists() and stamp.read_text() != deps:
            self._remove_tags(reference.rsplit(":", 1)[0], keep=None)
            self.buildah("rmi", "--prune", what="pruning the build cache")
        bundle = "/etc/ssl/certs/ca-certificates.crt"
        pip_cache = Path.home() / ".cache" / "pip"
        pip_cache.mkdir(parents=True, exist_ok=True)
        # --layers: the dependency layer is kept and reused while the lock and pyproject.toml stay as they are.
        self.buildah(
            "bud", "--quiet", "--layers", "--pull-never", "--network=host", "-f", str(dockerfile),
            f"--build-arg=BASE={base}", *(f"--build-arg={k}={v}" for k, v in args.items()),
            *([f"--volume={bundle}:/run/host-ca.crt:ro", "--build-arg=PIP_CERT=/run/host-ca.crt"]
              if Path(bundle).exists() else []),
            f"--volume={pip_cache}:/pip-cache", "--build-arg=PIP_CACHE_DIR=/pip-cache",
            "-t", reference, str(REPO), what=f"building the {name} image ({dockerfile.relative_to(REPO)})",
        )
        stamp.write_text(deps)
        self._remove_tags(reference.rsplit(":", 1)[0], keep=reference)
        return reference

    def _remove_tags(self, repository: str, keep: str | None) -> None:
        """Untag and free every image of ``repository`` but ``keep``, with the working containers (``buildah from``)
        left on them: buildah refuses to remove an image a container uses, and a build or test killed between
        ``buildah from`` and ``buildah rm`` leaves one. No test uses an image a newer build replaced."""
        for line in self.buildah("images", "--no-trunc", "--format={{.ID}} {{.Name}}:{{.Tag}}").splitlines():
            image, _, name = line.strip().partition(" ")
            name = name.strip()
            if name.startswith(repository + ":") and name != keep:
                self._remove_containers_of(image.removeprefix("sha256:"))
                self.buildah("rmi", name, what=f"removing the older {name}")

    def remove_stale_containers(self) -> list[str]:
        """Remove the working containers left on images that are no longer tagged, and those images (their layers:
        GBs for the training image). No build or test starts a container on an image without a name. Returns the
        removed containers' names."""
        removed = []
        for image_id in dict.fromkeys(c["imageid"] for c in self._containers() if not c.get("imagename")):
            removed += self._remove_containers_of(image_id)
            try:
                self.buildah("rmi", image_id, what=f"removing the untagged {image_id}")
            except RuntimeError as error:  # the parent of another image
                with self.log.open("a") as out:
                    out.write(f"kept {image_id}: {str(error).strip().splitlines()[-1]}\n")
        return removed

    def _containers(self) -> list[dict[str, Any]]:
        """buildah's working containers on this storage (``buildah containers --json``)."""
        return json.loads(self.buildah("containers", "--json").strip() or "[]") or []

    def _remove_containers_of(self, image_id: str) -> list[str]:
        names = []
        for container in self._containers():
            if container["imageid"] == image_id:
                self.buildah("rm", container["id"], what=f"removing the stale container {container['containername']}")
                with self.log.open("a") as out:
                    out.write(f"removed {container['containername']}, left on {image_id[:12]}\n")
                names.append(container["containername"])
        return names

def _dockerfile_reference(name: str, inputs: list[str], base: str, args: dict[str, str]) -> str:
    """The local reference of an image built from a Dockerfile: tagged by a hash of its inputs, base and args."""
    extra = " ".join([base, *(f"{k}={v}" for k, v in sorted(args.items()))])
    return f"localhost/trainjob-test/{name}:{_hash_paths([REPO / p for p in inputs], extra=extra)}"


def build_images(registry: Registry, components: dict[str, Any], log: Path) -> dict[str, str]:
    """Every image of the test cluster in ``registry``: name -> the reference pods use (at :data:`REGISTRY_HOST`)."""
    cache = cache_dir()
    builder = Builder(cache, log)
    bins = components["binaries"]
    references: dict[str, str] = {}
    with _locked(cache / ".lock"):
        builder.remove_stale_containers()
        wanted = {
            "pause": lambda: builder.from_binary("pause", Path(bins["pause"]), user="65535:65535"),
            "coredns": lambda: builder.from_binary("coredns", Path(bins["coredns"])),
            "trainjob-train": lambda: builder.training(builder.base()),
            "trainjob-operator": lambda: builder.operator(builder.base()),
            "trainjob-stacks": lambda: builder.stacks(builder.base()),
        }
        for name, build in wanted.items():
            local = build()
            tag = local.rsplit(":", 1)[1]
            repository = f"trainjob/{name}"
            if not registry.has(repository, tag):
                started = time.monotonic()
                builder.push(local, registry, f"{repository}:{tag}")
                with log.open("a") as out:
                    out.write(f"pushed {name} in {time.monotonic() - started:.0f} s\n")
            registry.forget_other_tags(repository, keep=tag)
            references[name] = f"{REGISTRY_HOST}/{repository}:{tag}"
    return references


def main() -> None:
    """``python -m kubetest.images``: build (or find) every image of the test cluster and push it to the registry's
    storage, so the first cluster test does not wait for it; prints each reference and the training image's size."""
    import json

    from kubetest.controlplane import build_components

    components = build_components()
    log = cache_dir() / "build.log"
    started = time.monotonic()
    with Registry.start(cache_dir() / "registry", cache_dir() / "registry.log") as registry:
        references = build_images(registry, components, log)
    listed = Builder(cache_dir(), log).buildah("images", "--format={{.Name}}:{{.Tag}} {{.Size}}").splitlines()
    sizes = dict(line.split(" ", 1) for line in listed if " " in line)
    local = local_reference(references["trainjob-train"])
    print(json.dumps({**references, "trainjob-train size": sizes.get(local, "?"),
                      "seconds": round(time.monotonic() - started)}))


if __name__ == "__main__":
    main()
