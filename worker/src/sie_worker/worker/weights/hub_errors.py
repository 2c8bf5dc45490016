"""What a failed snapshot download means to a user: huggingface_hub's, httpx's and the
disk's exceptions become :class:`DownloadFailed` (``load_failed``) saying what to do: 401
gated or unauthorized, 404 repo/revision/file not found, network errors, offline mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sie_worker.errors import LoadFailed
from sie_worker.worker.weights.cache import HubSettings, SnapshotKey, commit_of, repo_path
from sie_worker.worker.weights.files import NoWeights

__all__ = ["DownloadCancelled", "DownloadFailed", "hub_errors", "offline_message"]


class DownloadFailed(LoadFailed):
    """The snapshot could not be fetched; the message names the model and the fix."""


class DownloadCancelled(Exception):
    """The download was cancelled (unload, shutdown, Ctrl-C); nothing was marked complete."""


def offline_message(key: SnapshotKey, hub: HubSettings) -> str:
    repo_dir = repo_path(key, hub)
    commit = commit_of(key, repo_dir)
    snapshots = repo_dir / "snapshots"
    if commit is not None and (snapshots / commit).is_dir():
        state = (
            f"its snapshot {commit} in {hub.cache_dir} is incomplete (a download stopped "
            "halfway, or it was not fetched by sie-worker or hf download)"
        )
    elif commit is None and snapshots.is_dir() and any(snapshots.iterdir()):
        state = (
            f"the model cache {hub.cache_dir} holds only an incomplete snapshot of it (a "
            f"download stopped halfway; {key.revision!r} is recorded once one completes)"
        )
    else:
        state = f"it is not in the model cache {hub.cache_dir}"
    return (
        f"{key}: HF_HUB_OFFLINE is set and {state}; run `sie-worker fetch` where the hub is "
        "reachable (chart: workers.common.prefetch), or unset HF_HUB_OFFLINE"
    )


@contextlib.contextmanager
def hub_errors(key: SnapshotKey, hub: HubSettings) -> Iterator[None]:
    """Translate what huggingface_hub, httpx and the disk raise into :class:`DownloadFailed`."""
    import httpx
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = hub.endpoint
    try:
        yield
    except (DownloadFailed, DownloadCancelled):
        raise
    except NoWeights as exc:
        fix = (
            "name one of its files in the profile's adapter_options.loadtime, or point hf_id "
            "at a repo that holds it"
            if key.weights
            else "point hf_id at a repo in one of those formats"
        )
        raise DownloadFailed(f"{key} {exc}; {fix}") from exc
    except GatedRepoError as exc:
        status = _status(exc)
        token = "HF_TOKEN is not set" if hub.token is None else "the HF_TOKEN account has no access"
        raise DownloadFailed(
            f"{key}: {status} from {where}: the repo is gated and {token}; accept the model's "
            "terms on the Hub with an account, and set HF_TOKEN to its token "
            "(chart: workers.common.hfToken)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise DownloadFailed(
            f"{key}: {_status(exc)} from {where}: the repo has no revision {key.revision!r}; "
            "fix revision (hf_revision) in the model config"
        ) from exc
    except RemoteEntryNotFoundError as exc:
        raise DownloadFailed(
            f"{key}: {_status(exc)} from {where}: a file of the revision's listing is not "
            f"there ({exc.response.url if exc.response is not None else '?'}); retry later"
        ) from exc
    except RepositoryNotFoundError as exc:
        status = _status(exc)
        why = (
            "the repo does not exist, or it is private and HF_TOKEN is missing or has no access"
            if status.startswith("401")
            else "no such repo"
        )
        raise DownloadFailed(
            f"{key}: {status} from {where}: {why}; check hf_id in the model config "
            "(private repos need HF_TOKEN, chart: workers.common.hfToken)"
        ) from exc
    except HfHubHTTPError as exc:
        raise DownloadFailed(
            f"{key}: {_status(exc)} from {where}; the hub refused the download, the next load "
            "retries"
        ) from exc
    except OfflineModeIsEnabled as exc:
        raise DownloadFailed(offline_message(key, hub)) from exc
    except httpx.HTTPError as exc:
        raise DownloadFailed(
            f"{key}: could not download from {where} ({type(exc).__name__}: {exc}); check "
            "HF_ENDPOINT and that the pod may reach it (networkPolicy.egress); the next load "
            "retries"
        ) from exc
    except OSError as exc:
        raise DownloadFailed(
            f"{key}: {type(exc).__name__} while writing the model cache {hub.cache_dir}: {exc}"
        ) from exc


def _status(exc: Any) -> str:
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    if code is None:
        return "an error"
    reason = getattr(response, "reason_phrase", "") or ""
    return f"{code} {reason}".strip()
