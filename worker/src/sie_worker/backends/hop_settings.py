"""What the slot router and the gateway both read from the environment, with the prefix they
put before each variable (``SIE_ROUTER_``, ``SIE_GATEWAY_``): their polls of and calls to
their backends, the limits of the requests they take, and the prefix index.

| variable | default | meaning |
|---|---|---|
| ``SIE_API_KEY`` | none | bearer key clients must send; forwarded to the backends |
| ``SIE_MAX_BODY_BYTES`` | 8 MiB | request body limit |
| ``<prefix>POLL_INTERVAL_S`` / ``_POLL_TIMEOUT_S`` | router 0.5, gateway 1 / 5 | polls |
| ``<prefix>DOWN_AFTER_FAILURES`` | 3 | failed polls in a row that take a backend out |
| ``<prefix>CONNECT_TIMEOUT_S`` / ``_READ_TIMEOUT_S`` | 2 / 3600 | relay timeouts |
| ``SIE_DRAIN_TIMEOUT_S`` | 30 | how long in-flight requests may finish after SIGTERM |
| ``<prefix>PREFIX_BLOCK_CHARS`` | 256 | prompt characters per block of the prefix index |
| ``<prefix>PREFIX_INDEX_BLOCKS`` | 32768 | block hashes the prefix index keeps (0: off) |
| ``<prefix>RESUME_MAX`` | 2 | resumptions of a broken stream per request (0: off) |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sie_worker.backends.prefix import DEFAULT_BLOCK_CHARS, DEFAULT_INDEX_BLOCKS, PrefixConfig
from sie_worker.settings import SettingsError, env_int, env_seconds

__all__ = ["HopSettings", "hop_settings_from_env", "prefix_config_from_env"]


@dataclass(frozen=True, kw_only=True)
class HopSettings:
    api_key: str | None = None
    max_body_bytes: int = 8 * 1024 * 1024
    poll_interval_s: float = 1.0
    # A busy backend still answers a poll within seconds; only a hung one misses three in a
    # row, and only then are its in-flight requests aborted.
    poll_timeout_s: float = 5.0
    down_after_failures: int = 3
    connect_timeout_s: float = 2.0
    # A backstop only: workers cap their own loads and reads, and a backend that stops
    # answering polls fails its requests long before this.
    read_timeout_s: float = 3600.0
    drain_timeout_s: float = 30.0
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    # Resumptions of a stream whose backend fails mid-stream (DESIGN.md, "Resuming a
    # stream"), per request; 0 turns resumption off.
    resume_max: int = 2


def hop_settings_from_env(
    env: Mapping[str, str], prefix: str, *, poll_interval_s: float
) -> dict[str, Any]:
    """:class:`HopSettings`' fields from ``env``; raises ``SettingsError`` naming the
    variable."""
    return {
        "api_key": env.get("SIE_API_KEY") or None,
        "max_body_bytes": env_int(env, "SIE_MAX_BODY_BYTES", 8 * 1024 * 1024),
        "poll_interval_s": _seconds(env, f"{prefix}POLL_INTERVAL_S", poll_interval_s),
        "poll_timeout_s": _seconds(env, f"{prefix}POLL_TIMEOUT_S", 5.0),
        "down_after_failures": env_int(env, f"{prefix}DOWN_AFTER_FAILURES", 3),
        "connect_timeout_s": _seconds(env, f"{prefix}CONNECT_TIMEOUT_S", 2.0),
        "read_timeout_s": _seconds(env, f"{prefix}READ_TIMEOUT_S", 3600.0),
        "drain_timeout_s": _seconds(env, "SIE_DRAIN_TIMEOUT_S", 30.0),
        "prefix": prefix_config_from_env(env, prefix),
        "resume_max": _count(env, f"{prefix}RESUME_MAX", 2),
    }


def prefix_config_from_env(env: Mapping[str, str], prefix: str) -> PrefixConfig:
    """``{prefix}PREFIX_BLOCK_CHARS`` (above zero) and ``{prefix}PREFIX_INDEX_BLOCKS`` (0
    turns prefix-aware routing off)."""
    name = f"{prefix}PREFIX_INDEX_BLOCKS"
    raw = env.get(name, "").strip()
    try:
        blocks = 0 if raw == "0" else env_int(env, name, DEFAULT_INDEX_BLOCKS)
    except SettingsError:
        raise SettingsError(
            f"{name}: must be 0 (off) or an integer above zero, got {raw!r}"
        ) from None
    return PrefixConfig(env_int(env, f"{prefix}PREFIX_BLOCK_CHARS", DEFAULT_BLOCK_CHARS), blocks)


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    """An integer >= 0 (0 is a value here, not "unset")."""
    raw = env.get(name, "").strip()
    if raw == "0":
        return 0
    try:
        return env_int(env, name, default)
    except SettingsError:
        raise SettingsError(f"{name}: must be an integer >= 0, got {raw!r}") from None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    value = env_seconds(env, name, default)
    assert value is not None
    return value
