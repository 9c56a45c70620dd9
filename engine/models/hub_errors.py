"""How a failed request to the Hugging Face Hub is said: not reachable, no such repo or file, or something else,
each with what to do (the Models tab's downloads and the engine's reads of a repository before its weights)."""
from __future__ import annotations

from engine.errors import DownloadError


def unreachable(exc: BaseException | str, where: str) -> DownloadError:
    return DownloadError(f"Can't reach the Hugging Face Hub: {exc}; check the connection or put the files in "
                         f"{where}")


def hub_failure(exc: Exception, repo: str, where: str) -> DownloadError:
    """A message for what went wrong when asking the Hub: not reachable, no such repo or file, or other."""
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    chain = [exc, *([exc.__cause__] if exc.__cause__ else [])]   # a dry run wraps the Hub's error in its own
    cause = next((e for e in chain if isinstance(e, (RepositoryNotFoundError, GatedRepoError, EntryNotFoundError))
                  or is_connection_error(e)), chain[-1])
    if isinstance(cause, (RepositoryNotFoundError, GatedRepoError)):
        return DownloadError(f"{repo} is not on the Hugging Face Hub, or needs a login that this app does not have; "
                             "check the repo id")
    if isinstance(cause, EntryNotFoundError):
        return DownloadError(f"{repo} has no such file; check the path in the repo")
    if is_connection_error(cause):
        return unreachable(f"{type(cause).__name__}: {cause}", where)
    return DownloadError(f"could not download {repo} ({type(cause).__name__}: {cause}); try again, or put the files "
                         f"in {where}")


def is_connection_error(exc: BaseException) -> bool:
    import httpx2

    return isinstance(exc, (httpx2.TransportError, ConnectionError, TimeoutError))
