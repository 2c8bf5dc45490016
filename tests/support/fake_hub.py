"""A local stand-in for the Hugging Face Hub's file API, for tests and benchmarks (``HF_ENDPOINT``).

It answers what huggingface_hub asks when it downloads a model:

- ``GET /api/models/{org}/{name}/revision/{revision}`` (``?blobs=true`` adds sizes): the
  commit (``sha``) and the file listing (``siblings``). An unknown repo answers 404
  ``X-Error-Code: RepoNotFound``, an unknown revision 404 ``RevisionNotFound``.
- ``GET /api/models/{org}/{name}/tree/{revision}``: the recursive listing (what ``hf
  download`` reads).
- ``HEAD`` / ``GET /{org}/{name}/resolve/{revision}/{path}``: ``X-Repo-Commit``, ``ETag``
  (``X-Linked-Etag`` and ``X-Linked-Size`` for large files, as for LFS), ``Content-Length``,
  ``Accept-Ranges``; ``Range: bytes=N-`` answers 206 with ``Content-Range``. A gated repo
  answers 401 ``X-Error-Code: GatedRepo`` unless ``Authorization: Bearer <its token>``; a
  missing file 404 ``EntryNotFound``.

Knobs for failures: :meth:`FakeHub.drop` closes the connection after N bytes of a file (a
dropped download), :attr:`FakeHub.bytes_per_s` slows every body down, :meth:`FakeHub.stop`
takes the endpoint away. :attr:`FakeHub.requests` records what was asked (method, path,
range, authorization) and :meth:`FakeHub.gets` the file bodies served.

Usage::

    with FakeHub() as hub:
        commit = hub.add_repo("org/tiny", synthetic_model_files())
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = [
    "FakeHub",
    "Request",
    "fetched_files",
    "gguf_repo_files",
    "synthetic_model_files",
    "tiny_model_files",
]

_LFS_MIN_BYTES = 10_000  # larger files are announced as LFS (X-Linked-* headers)
_CHUNK = 1 << 20
Content = bytes | Path


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class _Commit:
    sha: str
    files: dict[str, Content]


@dataclass
class _Repo:
    repo_id: str
    gated_token: str | None
    commits: dict[str, _Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)


def _size(content: Content) -> int:
    return len(content) if isinstance(content, bytes) else content.stat().st_size


def _digest(content: Content, algorithm: str, prefix: bytes = b"") -> str:
    h = hashlib.new(algorithm, prefix)
    if isinstance(content, bytes):
        h.update(content)
    else:
        with content.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()


class FakeHub:
    """The fake hub on 127.0.0.1 (a free port), serving from threads of this process."""

    def __init__(self) -> None:
        self._repos: dict[str, _Repo] = {}
        self._drops: dict[tuple[str, str], list[int]] = {}
        self._etags: dict[tuple[str, str, str], tuple[str, str]] = {}
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self.bytes_per_s: float | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- content ---------------------------------------------------------------------

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, Content],
        *,
        revision: str = "main",
        gated_token: str | None = None,
    ) -> str:
        """Add a commit of ``files`` on branch ``revision`` (creating the repo); its sha."""
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo(repo_id, gated_token))
            sha = hashlib.sha1(f"{repo_id}:{len(repo.commits)}:{revision}".encode()).hexdigest()
            commit = repo.commits[sha] = _Commit(sha, dict(files))
            repo.refs[revision] = sha
        for path in files:  # hashed now, so serving never waits for it
            self._etag(repo_id, commit, path)
        return sha

    def drop(self, repo_id: str, path: str, after_bytes: int, times: int = 1) -> None:
        """The next ``times`` bodies of ``path`` end after ``after_bytes`` bytes: the
        connection is closed mid-file."""
        with self._lock:
            self._drops[(repo_id, path)] = [after_bytes] * times

    def gets(self, repo_id: str | None = None) -> list[Request]:
        """File bodies asked for (GET on resolve URLs), optionally of one repo."""
        prefix = f"/{repo_id}/resolve/" if repo_id else None
        return [
            r
            for r in list(self.requests)
            if r.method == "GET"
            and "/resolve/" in r.path
            and (prefix is None or r.path.startswith(prefix))
        ]

    # --- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._server.allow_reuse_address = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener: the endpoint refuses connections until :meth:`start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- answers (called from the handler's threads) ---------------------------------

    def _lookup(self, repo_id: str, revision: str) -> tuple[_Repo | None, _Commit | None]:
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                return None, None
            sha = repo.refs.get(revision, revision)
            return repo, repo.commits.get(sha)

    def _etag(self, repo_id: str, commit: _Commit, path: str) -> tuple[str, str]:
        key = (repo_id, commit.sha, path)
        with self._lock:
            known = self._etags.get(key)
        if known is None:
            content = commit.files[path]
            size = _size(content)
            git = _digest(content, "sha1", f"blob {size}\0".encode())
            lfs = _digest(content, "sha256") if size >= _LFS_MIN_BYTES else ""
            known = (git, lfs)
            with self._lock:
                self._etags[key] = known
        return known

    def _next_drop(self, repo_id: str, path: str) -> int | None:
        with self._lock:
            pending = self._drops.get((repo_id, path))
            return pending.pop(0) if pending else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeHub

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        url = urlsplit(self.path)
        self.fake.requests.append(
            Request(
                self.command,
                unquote(url.path),
                self.headers.get("Range"),
                self.headers.get("Authorization"),
            )
        )
        parts = url.path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            self._model_info("/".join(parts[2:4]), unquote("/".join(parts[5:])), url.query)
        elif parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
            self._tree("/".join(parts[2:4]), unquote(parts[5]))
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(
                "/".join(parts[:2]), unquote(parts[3]), unquote("/".join(parts[4:])), body
            )
        else:
            self._error(404, "EntryNotFound", "no such route")

    def _model_info(self, repo_id: str, revision: str, query: str) -> None:
        repo, commit = self.fake._lookup(repo_id, revision)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        blobs = parse_qs(query).get("blobs") in (["True"], ["true"], ["1"])
        siblings = []
        for path, content in sorted(commit.files.items()):
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                git, lfs = self.fake._etag(repo_id, commit, path)
                sibling.update({"size": _size(content), "blobId": git})
                if lfs:
                    sibling["lfs"] = {"sha256": lfs, "size": _size(content), "pointerSize": 134}
            siblings.append(sibling)
        payload = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": commit.sha,
            "private": False,
            "gated": "manual" if repo.gated_token else False,
            "siblings": siblings,
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _tree(self, repo_id: str, revision: str) -> None:
        """The recursive file listing ``hf download`` (snapshot_download) reads."""
        repo, commit = self.fake._lookup(repo_id, revision)
        if repo is None or commit is None:
            self._error(404, "RepoNotFound" if repo is None else "RevisionNotFound", "not found")
            return
        entries = []
        for path, content in sorted(commit.files.items()):
            git, lfs = self.fake._etag(repo_id, commit, path)
            entry: dict[str, Any] = {"type": "file", "path": path, "size": _size(content)}
            entry["oid"] = git
            if lfs:
                entry["lfs"] = {"oid": lfs, "size": _size(content), "pointerSize": 134}
            entries.append(entry)
        data = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _resolve(self, repo_id: str, revision: str, path: str, body: bool) -> None:
        repo, commit = self.fake._lookup(repo_id, revision)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", body)
            return
        if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            message = f"Access to model {repo_id} is restricted. You must have access to it."
            self._error(401, "GatedRepo", message, body)
            return
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
            return
        content = commit.files.get(path)
        if content is None:
            self._error(404, "EntryNotFound", f"{path} does not exist", body)
            return
        git, lfs = self.fake._etag(repo_id, commit, path)
        size = _size(content)
        start = _range_start(self.headers.get("Range"))
        if start is not None and start >= size:
            self._error(416, None, "range not satisfiable", body)
            return
        offset = start or 0
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", commit.sha)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{git}"')
        if lfs:
            self.send_header("X-Linked-Etag", f'"{lfs}"')
            self.send_header("X-Linked-Size", str(size))
        if start:
            self.send_header("Content-Range", f"bytes {offset}-{size - 1}/{size}")
        self.send_header("Content-Length", str(size - offset))
        self.end_headers()
        if body:
            self._send(repo_id, path, content, offset, size)

    def _send(self, repo_id: str, path: str, content: Content, offset: int, size: int) -> None:
        drop = self.fake._next_drop(repo_id, path)
        end = size if drop is None else min(size, offset + drop)
        self.wfile.flush()
        if isinstance(content, bytes):
            self._send_bytes(content[offset:end])
        else:
            with content.open("rb") as f:
                self._send_file(f, offset, end)
        if drop is not None:
            # Headers promised the whole file: the client sees a body cut short.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        for i in range(0, len(view), _CHUNK):
            self._pace(min(_CHUNK, len(view) - i))
            self.wfile.write(view[i : i + _CHUNK])

    def _send_file(self, f: Any, offset: int, end: int) -> None:
        while offset < end:
            count = min(_CHUNK * 16 if self.fake.bytes_per_s is None else _CHUNK, end - offset)
            self._pace(count)
            sent = os.sendfile(self.connection.fileno(), f.fileno(), offset, count)
            if sent == 0:
                return
            offset += sent

    def _pace(self, n: int) -> None:
        if self.fake.bytes_per_s:
            time.sleep(n / self.fake.bytes_per_s)

    def _error(self, status: int, code: str | None, message: str, body: bool = True) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


def _range_start(header: str | None) -> int | None:
    if not header or not header.startswith("bytes="):
        return None
    first = header[len("bytes=") :].split(",")[0].split("-")[0]
    return int(first) if first.isdigit() else None


# --- repos --------------------------------------------------------------------------------


def synthetic_model_files(
    *, heads: int = 4, kv_heads: int = 2, weights_bytes: int = 3_000_000, shards: int = 1
) -> dict[str, Content]:
    """A model repo the fake SGLang engine can be started from: a config.json with head
    counts, a tokenizer, weights of ``weights_bytes`` in ``shards`` safetensors files (with
    an index when sharded), and files an engine never needs (which must not be fetched)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_size": 64,
        "num_hidden_layers": 2,
    }
    files: dict[str, Content] = {
        "config.json": json.dumps(config).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}).encode(),
        "tokenizer_config.json": b'{"model_max_length": 512}',
        "README.md": b"# tiny\n",
        ".gitattributes": b"*.safetensors filter=lfs\n",
        "original/consolidated.00.pth": _pseudo_random(50_000, 7),
        "onnx/model.onnx": _pseudo_random(40_000, 8),
        "pytorch_model.bin": _pseudo_random(30_000, 9),  # the other format: never both
    }
    per_shard = max(1, weights_bytes // shards)
    if shards == 1:
        files["model.safetensors"] = _pseudo_random(per_shard, 1)
        return files
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for i, name in enumerate(names):
        files[name] = _pseudo_random(per_shard, i + 1)
    index = {"metadata": {"total_size": per_shard * shards}, "weight_map": {}}
    index["weight_map"] = {f"layer.{i}.weight": name for i, name in enumerate(names)}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    files["consolidated.safetensors"] = _pseudo_random(per_shard * shards, 99)  # Mistral's own
    return files


def gguf_repo_files() -> dict[str, Content]:
    """A repo of two GGUF quantizations (``tiny-Q4_K_M.gguf``, ``tiny-Q8_0.gguf``; not real
    models) with a README, a config.json and a safetensors file a llama.cpp model never
    fetches."""
    return {
        "README.md": b"# tiny GGUF\n",
        "config.json": b'{"model_type": "llama"}',
        "tiny-Q4_K_M.gguf": b"GGUF" + _pseudo_random(20_000, 4),
        "tiny-Q8_0.gguf": b"GGUF" + _pseudo_random(30_000, 8),
        "model.safetensors": _pseudo_random(1_000, 5),
    }


def tiny_model_files(model_dir: Path) -> dict[str, Content]:
    """Every file of a built model folder (e.g. tests/support/tiny_models.py's tiny Llama),
    plus an ``original/`` checkpoint the worker must leave on the hub."""
    files: dict[str, Content] = {
        str(p.relative_to(model_dir)): p for p in sorted(model_dir.rglob("*")) if p.is_file()
    }
    files["original/consolidated.00.pth"] = _pseudo_random(20_000, 3)
    return files


def _pseudo_random(n: int, seed: int) -> bytes:
    block = hashlib.sha256(f"fake-hub-{seed}".encode()).digest() * 2048  # 64 KiB
    out = bytearray()
    while len(out) < n:
        out += block[: min(len(block), n - len(out))]
        block = block[1:] + block[:1]
    return bytes(out)


def fetched_files(hub: FakeHub, repo_id: str) -> list[str]:
    """Paths of the files of ``repo_id`` whose bodies were asked for, in order, repeats kept."""
    return [r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.gets(repo_id)]


def _main(argv: list[str] | None = None) -> int:
    """Serve a model folder as a one-repo hub until killed (benchmarks, trying things out)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description="serve FOLDER as REPO on a fake hub")
    parser.add_argument("folder", type=Path)
    parser.add_argument("repo")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    hub = FakeHub()
    hub.port = args.port
    files = {
        str(p.relative_to(args.folder)): p for p in sorted(args.folder.rglob("*")) if p.is_file()
    }
    hub.add_repo(args.repo, files)
    hub.start()
    print(hub.url, flush=True)  # the caller reads the endpoint from the first line
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    hub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
