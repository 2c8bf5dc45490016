"""Start one engine for a placed model: book its ports, plan it, start it, wait until ready.

Starts on one device are serialized (:class:`StartGate`): SGLang takes its memory fraction of
what is free when it starts, so the worker measures the free memory, computes the share and
starts the engine with no other start on that device in between.

Ports are booked in a :class:`PortBook`: a free port passes the bind test until its engine
binds it, so two loads starting at once could otherwise both pick it; a load's bookings
are held until its engine is registered as running (or the load ends), then given back.
An engine that finds its port taken anyway (another process bound it between the check
and the engine's bind) is stopped and started again on another port, a bounded number of
times; a declared rendezvous port (``nccl_port``) is kept, as is a group's
(:mod:`~sie_worker.worker.launcher.ranks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from sie_worker.config.load.load_options import LoadOptions
from sie_worker.config.model import ServedModel
from sie_worker.errors import LoadFailed
from sie_worker.http.connections import Connections
from sie_worker.settings import Settings
from sie_worker.sizing.memory_needs import EngineShare
from sie_worker.worker.launcher import ports
from sie_worker.worker.launcher.plan import engine_env, family_of_load, plan_launch
from sie_worker.worker.launcher.process import EngineProcess, PortInUse
from sie_worker.worker.launcher.ranks import group_rank

__all__ = ["PORT_ATTEMPTS", "Booking", "PortBook", "RunningEngine", "StartGate", "start_engine"]

_log = logging.getLogger("sie_worker.manager")
PORT_ATTEMPTS = 3  # engine starts per load when the picked port turns out to be taken
_PEER_WAIT_S = 900.0  # a leader's wait for its followers' servers without startup_timeout_s


@dataclass
class RunningEngine:
    """An engine serving a model, with the requests it is serving."""

    engine: EngineProcess
    options: LoadOptions
    nccl_port: int | None
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Kept-alive connections to the engine's HTTP port, for its requests (JSON and streams).
    connections: Connections = field(default_factory=Connections)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def ports(self) -> set[int]:
        """The ports this engine holds (HTTP, and rendezvous when it has one)."""
        return {self.engine.port} | ({self.nccl_port} if self.nccl_port is not None else set())


class StartGate:
    """One engine start at a time on each device; a block waits for all of its devices, taken
    in index order (so two blocks never wait on each other)."""

    def __init__(self) -> None:
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)

    @contextlib.asynccontextmanager
    async def hold(self, block: Sequence[int]) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for index in sorted(set(block)):
                await stack.enter_async_context(self._locks[index])
            yield


class PortBook:
    """Ports held for engines still starting, beside the ports running engines hold."""

    def __init__(self, running_ports: Callable[[], set[int]]) -> None:
        self._running_ports = running_ports
        self._held: set[int] = set()

    def in_use(self) -> set[int]:
        return self._held | self._running_ports()

    @contextlib.contextmanager
    def booking(self) -> Iterator[Booking]:
        """Bookings for one load, given back when the block ends."""
        booking = Booking(self)
        try:
            yield booking
        finally:
            self._held -= booking.ports


class Booking:
    """The ports one load holds. Booking is synchronous: no other load can pick a port
    between the choice and the hold."""

    def __init__(self, book: PortBook) -> None:
        self._book = book
        self.ports: set[int] = set()

    def pick(self, candidates: range) -> int:
        return self.hold(ports.pick_port(candidates, self._book.in_use()))

    def hold(self, port: int) -> int:
        self.ports.add(port)
        self._book._held.add(port)
        return port


async def start_engine(
    served: ServedModel,
    options: LoadOptions,
    devices: tuple[str, ...],
    *,
    booking: Booking,
    settings: Settings,
    base_env: Mapping[str, str],
    client: httpx.AsyncClient,
    share: EngineShare | None = None,
) -> RunningEngine:
    """A ready engine for ``served`` on ``devices`` (``share``: what it is told of its
    memory, :func:`~sie_worker.sizing.memory_needs.engine_share`). Raises :class:`LoadFailed` (and
    its kinds: :class:`~sie_worker.worker.launcher.process.OutOfMemory` among them) or
    :class:`~sie_worker.errors.StartupTimeout`; a failed engine is always stopped."""
    family = family_of_load(options)
    group = group_rank(served.id, options.nccl_port, settings) if options.grouped else None
    declared = group.port if group is not None else options.nccl_port
    # A declared rendezvous port is held too, so other loads' engine ports stay off it.
    picks = family.picks_rendezvous
    nccl_port = booking.hold(declared) if declared else _pick_rendezvous(booking, picks)
    if group is not None:
        await _peers_answer(family.awaited_peers(group, settings), options.startup_timeout_s)
    last_error: LoadFailed | None = None
    for _ in range(PORT_ATTEMPTS):
        port = booking.pick(ports.ENGINE_PORTS)
        plan = plan_launch(
            served,
            options,
            devices,
            port=port,
            nccl_port=nccl_port,
            settings=settings,
            share=share,
            group=group,
        )
        engine = await EngineProcess.start(
            served.id,
            plan.argv,
            engine_env(base_env, plan),
            port,
            cores=plan.cores,
            ranks=family.rank_processes,
            shm_names=family.shm_names,
            shm_orphans=family.shm_orphans,
        )
        try:
            if plan.health_path is None:
                await engine.wait_started()  # a headless rank: no HTTP to ask
            else:
                await engine.wait_ready(client, plan.health_path, options.startup_timeout_s)
        except PortInUse as exc:
            _log.warning("%s; retrying on another port", exc.message)
            last_error = exc
            await engine.stop(settings.engine_stop_grace_s)
            # Either port may be the taken one; a declared rendezvous port stays.
            if not declared:
                nccl_port = _pick_rendezvous(booking, picks)
            continue
        except BaseException:
            await asyncio.shield(engine.stop(settings.engine_stop_grace_s))
            raise
        return RunningEngine(engine, options, plan.nccl_port)
    assert last_error is not None
    raise LoadFailed(f"{last_error.message} ({PORT_ATTEMPTS} ports tried)")


async def _peers_answer(peers: Sequence[tuple[str, int]], timeout_s: float | None) -> None:
    """Wait until each ``(host, port)`` accepts a connection: a group leader whose engine
    needs its followers' servers up first (llama.cpp's RPC servers). Raises
    :class:`LoadFailed` naming the first that did not answer within ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (timeout_s if timeout_s is not None else _PEER_WAIT_S)
    for host, port in peers:
        while True:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2.0)
            except (OSError, TimeoutError):
                if loop.time() >= deadline:
                    raise LoadFailed(
                        f"the group's follower at {host}:{port} did not answer; the leader's "
                        "engine starts once every follower's server does"
                    ) from None
                await asyncio.sleep(0.5)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            break


def _pick_rendezvous(booking: Booking, picks: bool) -> int | None:
    """A rendezvous port for an engine whose family takes the worker's (SGLang), else None."""
    return booking.pick(ports.RENDEZVOUS_PORTS) if picks else None
