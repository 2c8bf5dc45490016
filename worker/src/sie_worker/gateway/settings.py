"""Gateway settings, read once from the environment the chart sets.

| variable | default | meaning |
|---|---|---|
| ``SIE_GATEWAY_POOLS`` | (required) | the pools file (:mod:`sie_worker.gateway.pools`) |
| ``SIE_GATEWAY_MAX_HELD`` | 256 | requests one pool x bundle without a ready pod may hold |
| ``SIE_GATEWAY_HOLD_S`` | 60 | how long a held request waits for a ready pod (below 150) |
| ``SIE_GATEWAY_RETRY_AFTER_S`` | 5 | Retry-After of ``provisioning`` answers |
| ``SIE_GATEWAY_SLOT_TARGET`` | 4 | in-flight requests per slot before load bounds apply |
| ``SIE_GATEWAY_NAMESPACE`` | the pod's | namespace of the pool Services (cluster runs) |
| ``SIE_CONFIG_DIR`` | none | the shipped model configs: which pools can serve a model |
| ``SIE_API_KEY`` | none | bearer key clients must send; forwarded to the pods |
| ``SIE_MAX_BODY_BYTES`` | 8 MiB | request body limit |
| ``SIE_GATEWAY_POLL_INTERVAL_S`` / ``_POLL_TIMEOUT_S`` | 1 / 5 | polls of each pod's router |
| ``SIE_GATEWAY_DOWN_AFTER_FAILURES`` | 3 | failed polls in a row that take a pod out of rotation |
| ``SIE_GATEWAY_CONNECT_TIMEOUT_S`` / ``_READ_TIMEOUT_S`` | 2 / 3600 | relay timeouts |
| ``SIE_GATEWAY_RELOAD_INTERVAL_S`` | 1 | how often a local pools file is checked for changes |
| ``SIE_DRAIN_TIMEOUT_S`` | 30 | how long in-flight requests may finish after SIGTERM |
| ``SIE_GATEWAY_PREFIX_BLOCK_CHARS`` | 256 | prompt characters per block of the prefix index |
| ``SIE_GATEWAY_PREFIX_INDEX_BLOCKS`` | 32768 | block hashes the prefix index keeps (0: off) |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sie_worker.backends.hop_settings import HopSettings, hop_settings_from_env
from sie_worker.settings import SettingsError, env_int, env_seconds

__all__ = ["DEFAULT_GATEWAY_PORT", "SDK_READ_TIMEOUT_S", "GatewaySettings", "GatewaySettingsError"]

DEFAULT_GATEWAY_PORT = 8080
# sie-sdk reads for at most this long and does not retry a read timeout, so a hold must
# end (with a retryable 503 provisioning) well before it.
SDK_READ_TIMEOUT_S = 150.0


class GatewaySettingsError(SettingsError):
    """An environment variable has a value the gateway cannot use; the message names it."""


@dataclass(frozen=True)
class GatewaySettings(HopSettings):
    """The gateway's own settings, and those it shares with the router
    (:class:`HopSettings`, its variables prefixed ``SIE_GATEWAY_``)."""

    pools_file: Path
    max_held: int = 256
    hold_s: float = 60.0
    retry_after_s: int = 5
    # In-flight requests per serving slot a pod carries before the load bound moves work to
    # other pods (the chart passes autoscaling.triggers.inflight.targetPerSlot).
    slot_target: int = 4
    namespace: str | None = None
    config_dir: Path | None = None
    # How often a local pools file is checked for changed endpoints.
    reload_interval_s: float = 1.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GatewaySettings:
        """Read every variable the gateway uses; raise :class:`GatewaySettingsError` naming it."""
        pools = env.get("SIE_GATEWAY_POOLS", "").strip()
        if not pools:
            raise GatewaySettingsError(
                "SIE_GATEWAY_POOLS is not set; point it at the pools file (the chart renders "
                "it; for a local run write one, see `sie-worker gateway --help`)"
            )
        try:
            hold = env_seconds(env, "SIE_GATEWAY_HOLD_S", 60.0)
            assert hold is not None
            if hold >= SDK_READ_TIMEOUT_S:
                raise GatewaySettingsError(
                    f"SIE_GATEWAY_HOLD_S: {hold:g} s is not below {SDK_READ_TIMEOUT_S:g} s, the "
                    "read timeout of sie-sdk, which does not retry a timed-out read; hold for "
                    "less (clients retry 503 provisioning), e.g. 60"
                )
            config_dir = env.get("SIE_CONFIG_DIR", "").strip()
            return cls(
                pools_file=Path(pools),
                max_held=env_int(env, "SIE_GATEWAY_MAX_HELD", 256),
                hold_s=hold,
                retry_after_s=env_int(env, "SIE_GATEWAY_RETRY_AFTER_S", 5),
                slot_target=env_int(env, "SIE_GATEWAY_SLOT_TARGET", 4),
                namespace=env.get("SIE_GATEWAY_NAMESPACE", "").strip() or None,
                config_dir=Path(config_dir) if config_dir else None,
                reload_interval_s=_seconds(env, "SIE_GATEWAY_RELOAD_INTERVAL_S", 1.0),
                **hop_settings_from_env(env, "SIE_GATEWAY_", poll_interval_s=1.0),
            )
        except GatewaySettingsError:
            raise
        except SettingsError as exc:
            raise GatewaySettingsError(str(exc)) from None


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    value = env_seconds(env, name, default)
    assert value is not None
    return value
