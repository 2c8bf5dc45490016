"""Slot router settings, read once from the environment the chart sets.

Slots and worker ports:

* ``SIE_WORKER_PORTS`` (comma list) names one localhost port per slot, in slot order.
* ``SIE_GPU_COUNT`` is the number of serving slots. When both are set they must agree.
* With only ``SIE_GPU_COUNT``, slot ``i`` listens on ``SIE_WORKER_BASE_PORT + i``
  (base 8081, the port after the router's default 8080).
* With neither, the pod has one slot on ``SIE_WORKER_BASE_PORT``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sie_worker.backends.hop_settings import HopSettings, hop_settings_from_env
from sie_worker.settings import SettingsError, env_int, env_seconds

__all__ = ["DEFAULT_BASE_PORT", "DEFAULT_ROUTER_PORT", "RouterSettings", "RouterSettingsError"]

DEFAULT_ROUTER_PORT = 8080
DEFAULT_BASE_PORT = 8081
_MAX_PORT = 65535


class RouterSettingsError(SettingsError):
    """An environment variable has a value the router cannot use; the message names it."""


@dataclass(frozen=True)
class RouterSettings(HopSettings):
    """The router's own settings, and those it shares with the gateway (:class:`HopSettings`,
    its variables prefixed ``SIE_ROUTER_``)."""

    worker_ports: tuple[int, ...] = (DEFAULT_BASE_PORT,)
    worker_host: str = "127.0.0.1"
    poll_interval_s: float = field(default=0.5, kw_only=True)
    # How long a request may wait in the router for a slot to become usable (every slot
    # busy loading); then it goes to the least busy slot.
    queue_timeout_s: float = 900.0

    @property
    def slot_count(self) -> int:
        return len(self.worker_ports)

    def worker_url(self, slot: int) -> str:
        return f"http://{self.worker_host}:{self.worker_ports[slot]}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RouterSettings:
        """Read every variable the router uses; raise :class:`RouterSettingsError` naming it."""
        try:
            shared = hop_settings_from_env(env, "SIE_ROUTER_", poll_interval_s=0.5)
        except SettingsError as exc:
            raise RouterSettingsError(str(exc)) from None
        return cls(
            worker_ports=_worker_ports(env),
            worker_host=env.get("SIE_WORKER_HOST", "").strip() or "127.0.0.1",
            queue_timeout_s=_seconds(env, "SIE_ROUTER_QUEUE_TIMEOUT_S", 900.0),
            **shared,
        )


def _worker_ports(env: Mapping[str, str]) -> tuple[int, ...]:
    raw_ports = env.get("SIE_WORKER_PORTS", "").strip()
    raw_count = env.get("SIE_GPU_COUNT", "").strip()
    count = _positive_int(env, "SIE_GPU_COUNT", 1) if raw_count else None
    if raw_ports:
        items = [item.strip() for item in raw_ports.split(",") if item.strip()]
        ports = tuple(_port("SIE_WORKER_PORTS", item) for item in items)
        duplicates = sorted({p for p in ports if ports.count(p) > 1})
        if duplicates:
            raise RouterSettingsError(
                f"SIE_WORKER_PORTS: port {duplicates[0]} is listed twice; give each slot its "
                "own worker port"
            )
        if count is not None and count != len(ports):
            raise RouterSettingsError(
                f"SIE_WORKER_PORTS lists {len(ports)} port(s) but SIE_GPU_COUNT is {count}; "
                "list exactly one worker port per slot"
            )
        return ports
    base = _port("SIE_WORKER_BASE_PORT", env.get("SIE_WORKER_BASE_PORT", "").strip() or None)
    slots = count or 1
    if base + slots - 1 > _MAX_PORT:
        raise RouterSettingsError(
            f"SIE_WORKER_BASE_PORT: {base} + SIE_GPU_COUNT {slots} runs past port {_MAX_PORT}; "
            "choose a lower base port or set SIE_WORKER_PORTS"
        )
    return tuple(range(base, base + slots))


def _port(name: str, raw: str | None) -> int:
    if raw is None:
        return DEFAULT_BASE_PORT
    try:
        port = int(raw)
    except ValueError:
        raise RouterSettingsError(
            f"{name}: {raw!r} is not a port number; use integers from 1 to {_MAX_PORT}"
        ) from None
    if not 1 <= port <= _MAX_PORT:
        raise RouterSettingsError(f"{name}: port {port} is outside 1..{_MAX_PORT}")
    return port


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return env_int(env, name, default)
    except SettingsError as exc:
        raise RouterSettingsError(str(exc)) from None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = env_seconds(env, name, default)
    except SettingsError as exc:
        raise RouterSettingsError(str(exc)) from None
    assert value is not None
    return value
