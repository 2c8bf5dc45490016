"""One engine: start it, wait until it is ready, watch it and its ranks, stop it whole.

Each engine runs in its own process group (so stopping it stops every rank it spawned),
with a parent-death signal so it never outlives a worker killed with SIGKILL. That signal
reaches the engine's main process only, so a detached guard process (:class:`_GroupGuard`)
also holds every live engine group and SIGKILLs them when the worker is gone, however it
ended: rank processes never outlive the worker either. Its output goes to the worker log,
prefixed with the model id; the last lines are kept for errors.

An engine is its process group (:mod:`~sie_worker.worker.launcher.group`): on cpu devices it
starts on their cores (the affinity its ranks inherit); it gets a scratch folder of its own
as ``TMPDIR`` (vLLM's rendezvous file store lands there); once it is ready, the processes of
its group that its engine names as ranks are watched, and one of them exiting ends the
engine as its own exit does (:attr:`EngineProcess.ended`). Stopping it (SIGTERM to the group,
SIGKILL after the grace) waits until no process of the group is left, then removes the
shared-memory files the group used and its scratch folder: nothing of an engine survives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import psutil

from sie_worker.errors import LoadFailed, StartupTimeout
from sie_worker.worker.launcher.group import (
    Member,
    group_members,
    named_files,
    process_exited,
    ranks_of,
    remove_files,
    shared_memory_of,
    unclaimed_files,
)
from sie_worker.worker.launcher.group_guard import guard
from sie_worker.worker.launcher.spawn import engine_scratch, preexec

__all__ = ["EngineProcess", "OutOfMemory", "PortInUse"]

_log = logging.getLogger("sie_worker.engine")
_TAIL_LINES = 40
_POLL_FAST_S = 0.025
# SGLang's /health runs a one-token generation and answers once a second has passed and
# its detokenizer has answered: on a loaded CPU more than a couple of seconds. A shorter
# timeout would cut every check short and the engine would never be seen ready.
_HEALTH_TIMEOUT_S = 10.0
_NOTE_EVERY_S = 1.0  # while an engine starts, how often its group's processes are noted
_GROUP_GONE_S = 5.0  # how long a stop waits for the last process of a killed group
_RANK_GRACE_S = 0.5  # after a rank's exit, how long the engine's own exit may follow it
_PORT_IN_USE_MARKERS = ("address already in use", "errno 98", "eaddrinuse")
# What torch, CUDA and SGLang print when a device has too little memory for an engine.
_OUT_OF_MEMORY_MARKERS = (
    "cuda out of memory",
    "outofmemoryerror",
    "cudaerrormemoryallocation",
    "cublas_status_alloc_failed",
    "not enough memory. please try to increase --mem-fraction-static",
)


class PortInUse(LoadFailed):
    """The engine could not bind its port; the caller retries on another one."""


class OutOfMemory(LoadFailed):
    """The engine ran out of device memory while it started (CUDA or SGLang said so)."""


class EngineProcess:
    """A running engine. Create with :meth:`start`; always finish with :meth:`stop`."""

    def __init__(
        self,
        model: str,
        process: asyncio.subprocess.Process,
        port: int,
        *,
        ranks: re.Pattern[str] | None = None,
        scratch: Path | None = None,
        shm_names: tuple[str, ...] = (),
        shm_orphans: tuple[str, ...] = (),
    ) -> None:
        self.model = model
        self.port = port
        self.process = process
        self.tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self.stopping = False
        self.started_at = time.monotonic()
        self.shared_memory: set[Path] = set()  # /dev/shm files its group was seen using
        self._pids: set[int] = set()  # every process of its group seen so far
        self._shm_names = shm_names  # its family's /dev/shm names of one process ("{pid}")
        self._shm_orphans = shm_orphans  # its family's /dev/shm names tied to no pid
        self._started_epoch = time.time() - 1.0  # its files are changed after this
        self._noted_at = 0.0
        self._rank_pattern = ranks
        self._scratch = scratch
        self._rank_watchers: list[asyncio.Task[None]] = []
        self._rank_gone: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._relay_output(), name=f"engine-log:{model}")
        self._exited = asyncio.create_task(self._wait_exit(), name=f"engine-wait:{model}")
        self._ended = asyncio.create_task(self._wait_end(), name=f"engine-end:{model}")

    @classmethod
    async def start(
        cls,
        model: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        port: int,
        *,
        cores: tuple[int, ...] | None = None,
        ranks: re.Pattern[str] | None = None,
        shm_names: tuple[str, ...] = (),
        shm_orphans: tuple[str, ...] = (),
    ) -> EngineProcess:
        """Start the engine in a process group of its own, on ``cores`` (cpu devices);
        ``ranks``: the titles of its processes to watch once it is ready; ``shm_names``: the
        ``/dev/shm`` names its family gives a process's files (``{pid}`` its pid), removed
        when it stops whatever stopped it; ``shm_orphans``: names tied to no pid, removed
        when it stops if no live process holds them."""
        scratch, env = engine_scratch(env)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec(cores),
            )
        except OSError as exc:
            shutil.rmtree(scratch, ignore_errors=True)
            raise LoadFailed(f"{model}: cannot start engine {argv[0]!r}: {exc}") from exc
        _log.info("%s: engine started (pid %d, port %d)", model, process.pid, port)
        guard.add(process.pid, scratch)  # its own session: the group id is its pid
        return cls(
            model,
            process,
            port,
            ranks=ranks,
            scratch=scratch,
            shm_names=shm_names,
            shm_orphans=shm_orphans,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def exited(self) -> asyncio.Task[int]:
        """Completes with the exit code when the engine's main process ends."""
        return self._exited

    @property
    def ended(self) -> asyncio.Task[str]:
        """Completes, with why, when the engine's main process ends or one of its ranks
        does (after :meth:`watch_ranks`)."""
        return self._ended

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(list(self.tail)[-lines:])

    async def wait_ready(
        self, client: httpx.AsyncClient, health_path: str, timeout_s: float
    ) -> None:
        """Poll the health endpoint until it answers 200, the engine exits, or time runs out."""
        started = time.monotonic()
        deadline = started + timeout_s
        delay = 0.01
        url = self.base_url + health_path
        while True:
            if self._exited.done():
                await self._reader_drained()
                raise self._startup_exit_error()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StartupTimeout(
                    f"{self.model}: engine not ready within startup_timeout_s={timeout_s:g}s; "
                    "raise adapter_options.loadtime.startup_timeout_s if the model needs longer"
                    + self._tail_suffix()
                )
            timeout = min(_HEALTH_TIMEOUT_S, max(remaining, 0.05))
            check = asyncio.ensure_future(client.get(url, timeout=timeout))
            # An engine that exits while its check waits is seen at once: a process that took
            # the port after our bind test accepts the check and may never answer it.
            await asyncio.wait({check, self._exited}, return_when=asyncio.FIRST_COMPLETED)
            if not check.done():
                check.cancel()
                await asyncio.gather(check, return_exceptions=True)
                continue
            response = None
            with contextlib.suppress(httpx.HTTPError):
                response = check.result()
            # Only our engine's answer counts: another process (an engine of a worker sharing
            # the network namespace) may have taken the port after our bind test; our engine
            # then exits with "address already in use".
            if response is not None and response.status_code == 200 and self._owns_port():
                self.watch_ranks()
                return
            # A start that fails leaves files too: note the group's as it comes up.
            if time.monotonic() - self._noted_at >= _NOTE_EVERY_S:
                self.note_group()
            # Wake early if the engine exits while we sleep.
            await asyncio.wait({self._exited}, timeout=min(delay, max(remaining, 0.0)))
            # Poll briskly while a quick engine may be about to answer (the wait adds to every
            # load), then back off: a large model takes minutes and polls cost a little each.
            delay = min(delay * 1.5, _POLL_FAST_S if time.monotonic() - started < 10 else 0.5)

    async def wait_started(self, settle_s: float = 1.0) -> None:
        """A rank with no HTTP server (vLLM's headless ranks): ready once it has run for
        ``settle_s`` without exiting (it then waits for the group's leader on its own)."""
        await asyncio.wait({self._exited}, timeout=settle_s)
        if self._exited.done():
            await self._reader_drained()
            raise self._startup_exit_error()
        self.watch_ranks()

    def watch_ranks(self) -> None:
        """Note the group's ranks and shared memory (now that it is ready) and watch each
        rank: one exiting ends the engine (:attr:`ended`)."""
        members = self.note_group()
        for rank in ranks_of(members, self._rank_pattern):
            self._rank_watchers.append(
                asyncio.create_task(
                    self._watch_rank(rank.pid, rank.title), name=f"engine-rank:{self.model}"
                )
            )

    def note_group(self) -> list[Member]:
        """Note the group's live processes and the shared-memory files they use (each a file
        to remove once the group is gone, here or by the guard); return the processes."""
        members = group_members(self.process.pid)
        self._pids.update(m.pid for m in members)
        found = shared_memory_of(m.pid for m in members)
        if found - self.shared_memory:
            guard.files(self.process.pid, found - self.shared_memory)
        self.shared_memory |= found
        self._noted_at = time.monotonic()
        return members

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; reap; wait until no process
        of the group is left; remove its shared memory and scratch folder; return the main
        process's exit code."""
        self.stopping = True
        # Read while the group still runs: which shared-memory files it maps.
        self.note_group()
        if not self._exited.done():
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._exited), timeout=grace_s)
            except TimeoutError:
                _log.warning("%s: engine ignored SIGTERM for %gs; killing", self.model, grace_s)
        # Kill whatever is left in the group (ranks the main process spawned), then reap.
        self._signal_group(signal.SIGKILL)
        code = await self._exited
        await self._group_gone()
        guard.remove(self.process.pid)  # the group is killed and its leader reaped
        for task in self._rank_watchers:
            task.cancel()
        await asyncio.gather(*self._rank_watchers, self._ended, return_exceptions=True)
        named = named_files(self._shm_names, self._pids)
        orphans = unclaimed_files(self._shm_orphans, self._started_epoch)
        removed = remove_files(self.shared_memory | named | orphans)
        if removed:
            _log.info(
                "%s: removed %d shared-memory file(s) of the engine", self.model, len(removed)
            )
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        await self._reader_drained()
        return code

    async def _group_gone(self) -> None:
        """Wait until no process of the group is left (SIGKILLed, they go within moments)."""
        deadline = time.monotonic() + _GROUP_GONE_S
        while group_members(self.process.pid):
            if time.monotonic() > deadline:
                _log.warning("%s: processes of the engine's group outlive SIGKILL", self.model)
                return
            self._signal_group(signal.SIGKILL)
            await asyncio.sleep(0.02)

    async def _watch_rank(self, pid: int, title: str) -> None:
        await process_exited(pid, child=False)
        if not self._rank_gone.done():
            self._rank_gone.set_result(f"its rank process {title!r} (pid {pid}) exited")

    async def _wait_end(self) -> str:
        waits: set[asyncio.Future[object]] = {self._exited, self._rank_gone}  # type: ignore[arg-type]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not self._exited.done():
            # An engine that crashes takes its ranks along: its own exit says more.
            await asyncio.wait({self._exited}, timeout=_RANK_GRACE_S)
        if self._exited.done():
            return f"engine exited unexpectedly with code {self._exited.result()}"
        return f"engine failed: {self._rank_gone.result()}"

    def _owns_port(self) -> bool:
        """Whether a process of this engine listens on its port (True when unknowable)."""
        try:
            root = psutil.Process(self.process.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            return False
        inspected = False
        for process in processes:
            try:
                sockets = process.net_connections(kind="tcp")
            except psutil.NoSuchProcess:  # exited (a zombie too): it listens on nothing
                inspected = True
                continue
            except psutil.Error:  # access denied: unknowable
                continue
            inspected = True
            if any(s.status == psutil.CONN_LISTEN and s.laddr.port == self.port for s in sockets):
                return True
        return not inspected

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    async def _wait_exit(self) -> int:
        # Not process.wait(): on Python 3.11 it also waits until every copy of the output
        # pipe is closed, which a surviving child of the engine can keep open forever.
        await process_exited(self.process.pid)
        # The child watcher reaps it momentarily and sets no event we could wait on.
        while self.process.returncode is None:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        code = self.process.returncode
        level = logging.INFO if self.stopping else logging.WARNING
        _log.log(level, "%s: engine exited with code %s", self.model, code)
        return code

    async def _reader_drained(self) -> None:
        """Let the last output arrive; then stop reading even if a stray child holds the pipe."""
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._reader), timeout=1.0)
        if not self._reader.done():
            self._reader.cancel()
            transport = getattr(self.process, "_transport", None)  # no public close
            if transport is not None:
                transport.close()

    async def _relay_output(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the stream limit: take what is there
                raw = await stream.read(64 * 1024)
            if not raw:
                return
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            _log.info("[%s] %s", self.model, line)

    def _startup_exit_error(self) -> LoadFailed:
        code = self._exited.result()
        tail = self.log_tail()
        if any(marker in tail.lower() for marker in _PORT_IN_USE_MARKERS):
            return PortInUse(f"{self.model}: engine port {self.port} is already in use")
        # A traceback is long: the whole kept tail is searched.
        if any(marker in "\n".join(self.tail).lower() for marker in _OUT_OF_MEMORY_MARKERS):
            return OutOfMemory(
                f"{self.model}: engine ran out of device memory during startup (code {code})"
                + self._tail_suffix()
            )
        return LoadFailed(
            f"{self.model}: engine exited during startup with code {code}" + self._tail_suffix()
        )

    def _tail_suffix(self) -> str:
        tail = self.log_tail(8)
        return f"; last engine output:\n{tail}" if tail else ""
