"""``hf://`` sources: a dataset or model repository of a Hugging Face Hub, through ``huggingface_hub``.

The repository's files at a revision are listed once (``repo_info`` with file metadata: the commit, each file's
size and, for LFS files, its sha256); the commit is the version the cache keys on. The files are fetched at
that commit (so a branch that moves meanwhile cannot mix two versions), one ``hf_hub_download`` per file and
:data:`PARALLEL_FILES` at once, into the staging folder, with the token (``ACCESS_TOKEN``, ``HF_TOKEN``) and the
endpoint (``HF_ENDPOINT``) given. Each file's size and sha256 are checked as soon as it lands, while the others are
still arriving (``snapshot_download`` would leave all the hashing to the end, a second pass over the bytes).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainjob.errors import DownloadError
from trainjob.initializers.config import DATASET, InitializerConfig
from trainjob.initializers.transfer import Listing, RemoteFile, is_verified, verify_file

#: Files fetched at once (``snapshot_download``'s default is 8 too).
PARALLEL_FILES = 8


class HuggingFaceSource:
    """A Hub repository: :meth:`list` it, then :meth:`fetch` a listing of it into a folder."""

    def __init__(self, config: InitializerConfig) -> None:
        self.config = config
        self.repo_type = "dataset" if config.kind == DATASET else "model"

    def _api_kwargs(self) -> dict[str, object]:
        return {"token": self.config.access_token or None, "endpoint": self.config.hf_endpoint or None}

    def list(self) -> Listing:
        from huggingface_hub import HfApi
        from huggingface_hub.hf_api import RepoFile
        from huggingface_hub.utils import filter_repo_objects

        source = self.config.source
        api = HfApi(**self._api_kwargs())  # type: ignore[arg-type]
        try:  # the revision's commit, then its files: what snapshot_download itself asks
            sha = str(api.repo_info(source.repo_id, repo_type=self.repo_type, revision=source.revision).sha)
            tree = [entry for entry in api.list_repo_tree(source.repo_id, revision=sha, repo_type=self.repo_type,
                                                         recursive=True) if isinstance(entry, RepoFile)]
        except Exception as exc:  # the Hub client's errors, named for the user below
            raise self._error(exc) from exc
        kept = list(filter_repo_objects(tree, allow_patterns=_list(self.config.allow_patterns),
                                        ignore_patterns=_list(self.config.ignore_patterns), key=lambda e: e.path))
        if not kept:
            raise DownloadError(f"{self.config.where()}: no files to download at revision "
                                f"{source.revision or 'main'} ({len(tree)} in the repository) after the patterns "
                                f"(allow {_list(self.config.allow_patterns) or 'all'}, ignore "
                                f"{_list(self.config.ignore_patterns) or 'none'})")
        files = tuple(
            RemoteFile(path=e.path, size=int(e.size),
                       checksum=("sha256", e.lfs.sha256) if e.lfs is not None and e.lfs.sha256 else None)
            for e in kept
        )
        return Listing(version=sha, files=files)

    def fetch(self, listing: Listing, staging: Path) -> None:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # the run's own progress lines say how far it is, once every few seconds
        with ThreadPoolExecutor(max_workers=PARALLEL_FILES, thread_name_prefix="hub-fetch") as pool:
            for _ in pool.map(lambda remote: self._keep_or_fetch(remote, listing.version, staging), listing.files):
                pass

    def _keep_or_fetch(self, remote: RemoteFile, commit: str, staging: Path) -> None:
        """A file an earlier run left is kept if it checks out; anything else is fetched, then checked."""
        from huggingface_hub import hf_hub_download

        where, path = self.config.where(), staging / remote.path
        if is_verified(path, remote):
            try:
                verify_file(path, remote, where)
                return
            except DownloadError:
                path.unlink(missing_ok=True)
        try:
            hf_hub_download(self.config.source.repo_id, remote.path, repo_type=self.repo_type, revision=commit,
                            local_dir=staging, **self._api_kwargs())  # type: ignore[arg-type]
        except OSError as exc:
            if exc.errno is not None:  # a local error (the disk full): not the Hub's answer
                raise
            raise self._error(exc) from exc
        except Exception as exc:
            raise self._error(exc) from exc
        try:
            verify_file(path, remote, where)
        except DownloadError:
            path.unlink(missing_ok=True)  # fetched again by the next attempt, never kept
            raise

    def _error(self, exc: BaseException) -> DownloadError:
        """The Hub client's exception as a message naming the repository, the server's answer and what to do."""
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = self.config.where()
        status = getattr(getattr(exc, "response", None), "status_code", None)
        answer = f"{status} " if status else ""
        token = "an ACCESS_TOKEN (or HF_TOKEN) was given" if self.config.access_token else "no token was given"
        if isinstance(exc, GatedRepoError):
            return DownloadError(f"{where}: {answer}the repository is gated: accept its terms on the Hub and pass a "
                                 f"token that may read it ({token})")
        if isinstance(exc, RepositoryNotFoundError):
            return DownloadError(f"{where}: {answer}repository {self.config.source.repo_id!r} ({self.repo_type}) "
                                 f"not found, or private and {token}")
        if isinstance(exc, RevisionNotFoundError):
            return DownloadError(f"{where}: {answer}revision {self.config.source.revision!r} not found")
        if isinstance(exc, HfHubHTTPError):
            return DownloadError(f"{where}: {answer}{_first_line(exc)}", retryable=status is None or status >= 500)
        return DownloadError(f"{where}: {type(exc).__name__}: {_first_line(exc)}", retryable=True)


def _list(patterns: tuple[str, ...] | None) -> list[str] | None:
    return list(patterns) if patterns else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
