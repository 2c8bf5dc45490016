"""Pool choice by headers and model, and holding: bounded in count and time, drained."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from sie_worker.backends.prefix import PrefixConfig, prompt_blocks
from sie_worker.backends.routed import RoutedRequest
from sie_worker.errors import (
    EngineUnavailable,
    NoPool,
    Provisioning,
    QueueFull,
    UnknownModel,
    UnknownPool,
)
from sie_worker.gateway.catalogue import Catalogue
from sie_worker.gateway.choice import Selection, select_pools, selection
from sie_worker.gateway.metrics import GatewayMetrics
from sie_worker.gateway.pools import PoolKey, PoolSpec
from sie_worker.gateway.routing import Holder
from sie_worker.gateway.settings import GatewaySettings
from sie_worker.gateway.state import Endpoint, Fleet, PodPoll

pytestmark = pytest.mark.anyio

L4 = PoolSpec("l4", "sglang", "l4", "l4", service="a", port=1)
L4X4 = PoolSpec("l4-4x", "sglang", "l4-4x", "l4", slot_width=4, service="b", port=1)
CPU = PoolSpec("cpu", "default", "cpu", "cpu", service="c", port=1)
SPECS = (L4, L4X4, CPU)
NONE: dict[PoolKey, frozenset[str] | None] = {}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_headers_pick_pools_by_name_then_machine_profile_then_gpu_type() -> None:
    empty = Catalogue.empty()
    assert select_pools(SPECS, empty, NONE, "m") == [L4.key, L4X4.key, CPU.key]
    assert select_pools(SPECS, empty, NONE, "m", pool="L4-4X") == [L4X4.key]
    assert select_pools(SPECS, empty, NONE, "m", profile=" l4-4x ") == [L4X4.key]
    # l4 is pool l4's machine profile: the GPU type of l4-4x does not count then.
    assert select_pools(SPECS, empty, NONE, "m", profile="L4") == [L4.key]
    assert select_pools(SPECS, empty, NONE, "m", pool="l4-4x", profile="l4") == [L4X4.key]


def test_unknown_pools_are_refused_listing_the_pools() -> None:
    with pytest.raises(UnknownPool) as info:
        select_pools(SPECS, Catalogue.empty(), NONE, "m", pool="h100")
    assert info.value.message == (
        "X-SIE-Pool: no pool is named 'h100'; the pools are cpu (machine profile cpu, GPU "
        "type cpu), l4 (machine profile l4, GPU type l4), l4-4x (machine profile l4-4x, GPU "
        "type l4)"
    )
    assert info.value.sie_code == "POOL_NOT_FOUND"
    with pytest.raises(UnknownPool, match="X-SIE-MACHINE-PROFILE: pool 'cpu' has machine"):
        select_pools(SPECS, Catalogue.empty(), NONE, "m", pool="cpu", profile="l4")


def test_a_model_goes_only_where_it_fits_else_no_pool_says_why(tmp_path: Path) -> None:
    from tests.support.worker_fixtures import fake_model, write_config

    write_config(tmp_path, fake_model("org/wide", width=4))
    catalogue, _ = Catalogue.from_config_dir(tmp_path)
    assert select_pools(SPECS, catalogue, NONE, "org/wide") == [L4X4.key]
    with pytest.raises(NoPool) as info:
        select_pools(SPECS, catalogue, NONE, "org/wide", pool="l4")
    assert "needs 4 GPUs per slot" in info.value.message
    assert info.value.status == 409
    with pytest.raises(
        UnknownModel, match="not configured in any pool; configured models: org/wide"
    ):
        select_pools(SPECS, catalogue, NONE, "org/other")


def test_without_configs_a_model_no_polled_pool_lists_is_unknown_as_at_the_worker() -> None:
    polled = {L4.key: frozenset({"m"}), L4X4.key: frozenset({"x"}), CPU.key: frozenset()}
    with pytest.raises(UnknownModel, match="'nobody' is not configured in any pool") as info:
        select_pools(SPECS, Catalogue.empty(), polled, "nobody")
    assert (info.value.status, info.value.code) == (404, "unknown_model")
    # A pool not polled yet may serve it: its pods answer (unknown_model, if not).
    unpolled = {**polled, CPU.key: None}
    assert select_pools(SPECS, Catalogue.empty(), unpolled, "nobody") == [CPU.key]


def test_without_configs_the_pods_listings_decide() -> None:
    listings = {L4.key: frozenset({"m"}), L4X4.key: frozenset({"x"}), CPU.key: None}
    assert select_pools(SPECS, Catalogue.empty(), listings, "m") == [L4.key, CPU.key]
    with pytest.raises(NoPool, match="its pods do not serve m"):
        select_pools(SPECS, Catalogue.empty(), listings, "m", pool="l4-4x")


def _fleet(**settings: object) -> Fleet:
    config = GatewaySettings(Path("p.yaml"), **settings)  # type: ignore[arg-type]
    return Fleet(config, (L4,), GatewayMetrics([L4.key]))


def _ready(fleet: Fleet, name: str = "pod-0") -> None:
    fleet.set_endpoints(L4.key, [Endpoint(name, "http://127.0.0.1:1")])
    pod = fleet.groups[L4.key].pods[name]
    fleet.apply_poll(pod, 0.0, PodPoll({"m": "ready"}, {}, 0, 1, 1, True))


SELECTION = Selection("m", 1, (L4.key,))


async def test_a_held_request_is_served_once_a_pod_is_ready() -> None:
    fleet = _fleet(hold_s=30.0)
    holder = Holder(fleet)
    result = []

    async def pick() -> None:
        result.append(await holder.pick(SELECTION, frozenset()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(pick)
        await anyio.sleep(0.05)
        assert fleet.groups[L4.key].held == 1
        _ready(fleet)
    pod, decision = result[0]
    assert (pod.name, decision.reason) == ("pod-0", "ready")
    assert fleet.groups[L4.key].held == 0


async def test_a_hold_ends_with_provisioning_and_retry_after() -> None:
    holder = Holder(_fleet(hold_s=0.05, retry_after_s=3))
    with pytest.raises(Provisioning) as info:
        await holder.pick(SELECTION, frozenset())
    assert info.value.headers == {"Retry-After": "3"}
    assert info.value.sie_code == "PROVISIONING"
    assert "SIE_GATEWAY_HOLD_S" in info.value.message
    assert holder.fleet.groups[L4.key].held == 0


async def test_past_the_held_count_requests_get_queue_full_at_once() -> None:
    fleet = _fleet(hold_s=30.0, max_held=2)
    holder = Holder(fleet)
    errors: list[Exception] = []

    async def pick() -> None:
        try:
            await holder.pick(SELECTION, frozenset())
        except (Provisioning, QueueFull) as exc:
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(pick)
        await anyio.sleep(0.05)
        assert [type(e) for e in errors] == [QueueFull]
        assert errors[0].status == 429  # type: ignore[attr-defined]
        holder.drain()
    assert [type(e) for e in errors] == [QueueFull, Provisioning, Provisioning]
    assert all("shutting down" in str(e) for e in errors[1:])
    assert fleet.groups[L4.key].held == 0


async def test_an_excluded_pod_is_not_chosen_again() -> None:
    fleet = _fleet(hold_s=0.05)
    _ready(fleet, "pod-0")
    holder = Holder(fleet)
    pod, _ = await holder.pick(SELECTION, frozenset())
    with pytest.raises(Provisioning):
        await holder.pick(SELECTION, frozenset({pod.name}))


async def test_a_resumption_with_no_other_pod_is_refused_at_once_never_held() -> None:
    fleet = _fleet(hold_s=600)  # a held request would outlive the test's guard
    _ready(fleet, "pod-0")
    holder = Holder(fleet)
    pod, _ = await holder.pick(SELECTION, frozenset())
    with anyio.fail_after(10), pytest.raises(EngineUnavailable, match="no other ready pod"):
        await holder.pick(SELECTION, frozenset({pod.name}), hold=False)
    assert fleet.groups[L4.key].held == 0


async def test_a_keyless_chat_follows_its_prefix_to_the_pod_that_served_it() -> None:
    fleet = _fleet(prefix=PrefixConfig(block_chars=8, index_blocks=100))
    fleet.set_endpoints(
        L4.key, [Endpoint(f"pod-{i}", f"http://127.0.0.1:{i + 1}") for i in range(3)]
    )
    for pod in fleet.groups[L4.key].pods.values():
        fleet.apply_poll(pod, 0.0, PodPoll({"m": "ready"}, {}, 0, 1, 1, True))
    holder = Holder(fleet)
    history = [{"role": "system", "content": "You are an agent. " * 4}]

    def chosen(messages: list[dict[str, str]], session: str | None = None) -> Selection:
        payload = {"messages": messages}
        blocks = prompt_blocks(fleet.settings.prefix, "m", payload)
        routed = RoutedRequest("POST", "/", (), b"", "m", prefix=blocks, session=session)
        return selection((L4,), Catalogue.empty(), fleet, routed, {})

    first_pod, first = await holder.pick(chosen(history), frozenset())
    fleet.dispatched(first_pod, "m", first.reason)  # busier than the others now
    history.append({"role": "user", "content": "turn two"})
    pod, decision = await holder.pick(chosen(history), frozenset())
    assert (pod.name, decision.reason) == (first_pod.name, "prefix")
    # A session key wins over the prefix; the key's pod gets the blocks too.
    keyed = chosen(history, session="s")
    assert (await holder.pick(keyed, frozenset()))[1].reason in ("affinity", "affinity_spill")
    # A pod that leaves rotation takes its prefixes with it.
    fleet.mark_down(first_pod, "gone")
    assert (L4.key, first_pod.name) not in fleet.prefixes.match(chosen(history).prefix)
