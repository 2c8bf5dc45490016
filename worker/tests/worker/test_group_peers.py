"""Where a rank finds the other ranks of its group (``SIE_NODE_ADDRESSES``, else
LeaderWorkerSet's pod names), and when a peer counts as gone (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sie_worker.settings import Settings, SettingsError, split_address
from sie_worker.worker.group_peers import LOST_AFTER, PeerWatch, lws_addresses, peer_urls

LEADER = "sie-gpu-8x80-0.sie-gpu-8x80.default"


def settings(rank: int = 0, nodes: int = 2, **env: str) -> Settings:
    group = {"SIE_NODES": str(nodes), "SIE_NODE_RANK": str(rank), "SIE_LEADER_ADDRESS": LEADER}
    return Settings.from_env({"SIE_DEVICES": "cuda:0", **group, **env}, gpu=True).with_overrides(
        port=8080
    )


def test_on_a_leaderworkerset_every_rank_is_the_leaders_pod_name_and_its_index() -> None:
    assert lws_addresses(LEADER, 3) == (
        LEADER,
        "sie-gpu-8x80-0-1.sie-gpu-8x80.default",
        "sie-gpu-8x80-0-2.sie-gpu-8x80.default",
    )
    assert peer_urls(settings(rank=0, nodes=3)) == {
        1: "http://sie-gpu-8x80-0-1.sie-gpu-8x80.default:8080",
        2: "http://sie-gpu-8x80-0-2.sie-gpu-8x80.default:8080",
    }
    assert peer_urls(settings(rank=2, nodes=3)) == {
        0: f"http://{LEADER}:8080",
        1: "http://sie-gpu-8x80-0-1.sie-gpu-8x80.default:8080",
    }


@pytest.mark.parametrize("leader", ["127.0.0.1", "sie-0", "leader.example", "sie.x.y", "fd00::1"])
def test_a_leader_that_is_no_leaderworkerset_pod_name_gives_no_addresses(leader: str) -> None:
    assert lws_addresses(leader, 2) is None


@given(
    name=st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True),
    group=st.integers(0, 999),
    rest=st.from_regex(r"[a-z0-9]{1,10}(\.[a-z0-9]{1,10}){0,3}", fullmatch=True),
    nodes=st.integers(2, 16),
)
def test_derived_addresses_are_one_per_rank_each_a_pod_of_the_leaders_group(
    name: str, group: int, rest: str, nodes: int
) -> None:
    leader = f"{name}-{group}.{rest}"
    found = lws_addresses(leader, nodes)
    assert found is not None
    assert len(found) == nodes
    assert found[0] == leader
    for rank, address in enumerate(found[1:], start=1):
        assert address == f"{name}-{group}-{rank}.{rest}"


def test_sie_node_addresses_wins_and_its_ports_are_each_workers() -> None:
    found = settings(rank=1, SIE_NODE_ADDRESSES="127.0.0.1:8081, 127.0.0.1:8082")
    assert found.node_addresses == ("127.0.0.1:8081", "127.0.0.1:8082")
    assert peer_urls(found) == {0: "http://127.0.0.1:8081"}
    v6 = settings(rank=0, SIE_NODE_ADDRESSES="[fd00::1]:9000,fd00::2")
    assert peer_urls(v6) == {1: "http://[fd00::2]:8080"}


def test_without_addresses_or_a_pod_name_a_rank_has_no_peers_to_watch() -> None:
    alone = Settings.from_env({"SIE_DEVICES": "cuda:0"}, gpu=True)
    assert peer_urls(alone) == {}
    ip = Settings.from_env(
        {"SIE_DEVICES": "cuda:0", "SIE_NODES": "2", "SIE_NODE_RANK": "0",
         "SIE_LEADER_ADDRESS": "10.0.0.5"},
        gpu=True,
    )  # fmt: skip
    assert peer_urls(ip) is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("127.0.0.1:8081", "needs 2 addresses, one per rank of SIE_NODES=2"),
        ("a,b,c", "needs 2 addresses"),
        ("a,", "needs 2 addresses"),
        ("a,http://b", "'http://b' is not a host or host:port"),
        ("a,b:0", "'b:0' is not a host"),
        ("a,b:99999", "'b:99999' is not a host"),
        ("a,b:x", "'b:x' is not"),
        ("a,[fd00::1", "'[fd00::1' is not"),
        ("a,b/c", "'b/c' is not"),
    ],
)
def test_a_bad_sie_node_addresses_is_refused_by_name(value: str, says: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(SIE_NODE_ADDRESSES=value)
    assert str(caught.value).startswith("SIE_NODE_ADDRESSES: ")
    assert says in str(caught.value)


def test_sie_node_addresses_without_a_group_is_refused() -> None:
    with pytest.raises(SettingsError, match="SIE_NODE_ADDRESSES: set, but this worker is no"):
        Settings.from_env({"SIE_DEVICES": "cuda:0", "SIE_NODE_ADDRESSES": "a,b"}, gpu=True)


@pytest.mark.parametrize(
    ("entry", "split"),
    [
        ("host", ("host", None)),
        ("host:80", ("host", 80)),
        ("[fd00::1]:80", ("fd00::1", 80)),
        ("[fd00::1]", ("fd00::1", None)),
        ("fd00::1", ("fd00::1", None)),
        ("", None),
        ("[]:80", None),
        ("[fd00::1]80", None),
        ("[fd00::1]:", None),
        ("host:", None),
        (":80", None),
        ("a b", None),
    ],
)
def test_an_address_splits_into_its_host_and_port(
    entry: str, split: tuple[str, int | None] | None
) -> None:
    assert split_address(entry) == split


def test_a_peer_is_gone_after_failing_in_a_row_once_it_was_ready() -> None:
    watch = PeerWatch((1, 2))
    # Never ready: not watched (the group's engine cannot be ready without it).
    assert not any(watch.observe(1, False) for _ in range(LOST_AFTER * 2))
    assert not watch.watched(1)
    assert not watch.observe(1, True)
    for _ in range(LOST_AFTER - 1):
        assert not watch.observe(1, False)
    assert not watch.observe(1, True)  # an answer in between starts the count again
    assert [watch.observe(1, False) for _ in range(LOST_AFTER)] == [False] * (LOST_AFTER - 1) + [
        True
    ]
    assert not watch.watched(2)
