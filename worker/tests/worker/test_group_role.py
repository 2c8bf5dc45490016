"""A worker's part in a group of nodes: the three variables it reads, who serves, which
pinned models a rank keeps, what ``/readyz`` adds, and what a group engine ending does."""

from __future__ import annotations

from typing import Any

import pytest

from sie_worker.config.files.reader import parse_config
from sie_worker.config.model import served_models
from sie_worker.errors import NotLeader
from sie_worker.settings import Settings, SettingsError
from sie_worker.worker.group_role import GROUP_EXIT_STATUS, GroupRole

GROUP = {"SIE_NODES": "2", "SIE_NODE_RANK": "1", "SIE_LEADER_ADDRESS": "sie-0.sie.default"}


def settings(**env: str) -> Settings:
    return Settings.from_env({"SIE_DEVICES": "cuda:0,cuda:1", **env}, gpu=True)


def served(width: int) -> Any:
    doc = {
        "sie_id": f"org/w{width}",
        "hf_id": "org/m",
        "tasks": {"generate": {}},
        "profiles": {"default": {"adapter_options": {"loadtime": {"tensor_parallel_size": width}}}},
    }
    return served_models(parse_config(doc, source="<t>"))[0]


def test_a_group_is_read_from_its_three_variables() -> None:
    found = settings(**GROUP)
    assert (found.nodes, found.node_rank, found.leader_address) == (2, 1, "sie-0.sie.default")
    alone = settings()
    assert (alone.nodes, alone.node_rank, alone.leader_address) == (1, 0, None)


@pytest.mark.parametrize(
    ("env", "named", "says"),
    [
        ({"SIE_NODES": "2"}, "SIE_NODE_RANK", "needs SIE_NODES, SIE_NODE_RANK and SIE_LEADER"),
        ({**GROUP, "SIE_NODES": ""}, "SIE_NODES", "unset, but SIE_NODE_RANK and"),
        ({**GROUP, "SIE_LEADER_ADDRESS": " "}, "SIE_LEADER_ADDRESS", "unset"),
        ({**GROUP, "SIE_NODES": "1"}, "SIE_NODES", "at least 2"),
        ({**GROUP, "SIE_NODES": "two"}, "SIE_NODES", "'two'"),
        ({**GROUP, "SIE_NODE_RANK": "2"}, "SIE_NODE_RANK", "from 0 to 1 (SIE_NODES=2)"),
        ({**GROUP, "SIE_NODE_RANK": "-1"}, "SIE_NODE_RANK", "from 0 to 1"),
        ({**GROUP, "SIE_NODE_RANK": "x"}, "SIE_NODE_RANK", "got 'x'"),
        ({**GROUP, "SIE_LEADER_ADDRESS": "sie-0:29500"}, "SIE_LEADER_ADDRESS", "without"),
        ({**GROUP, "SIE_LEADER_ADDRESS": "http://sie-0"}, "SIE_LEADER_ADDRESS", "scheme"),
        ({**GROUP, "SIE_LEADER_ADDRESS": "a b"}, "SIE_LEADER_ADDRESS", "host"),
    ],
)
def test_a_bad_group_variable_is_refused_by_name(
    env: dict[str, str], named: str, says: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(**env)
    assert str(caught.value).startswith(f"{named}: ")
    assert says in str(caught.value)


def test_an_ipv6_leader_is_accepted() -> None:
    assert settings(**{**GROUP, "SIE_LEADER_ADDRESS": "fd00::1"}).leader_address == "fd00::1"


def test_a_follower_serves_nobody_and_keeps_only_the_groups_models() -> None:
    role = GroupRole(settings(**GROUP), stop=lambda: None)
    with pytest.raises(NotLeader) as caught:
        role.require_leader()
    error = caught.value
    assert (error.code, error.status) == ("not_leader", 409)
    assert "rank 1 of a group of 2 nodes" in error.message
    assert "rank 0 at sie-0.sie.default" in error.message
    assert role.serves_group(served(4))
    assert role.keeps_pinned(served(4))
    assert not role.serves_group(served(2))
    assert not role.keeps_pinned(served(2))
    assert role.probe_fields() == {"rank": 1, "nodes": 2, "leader": "sie-0.sie.default"}


def test_the_leader_serves_and_keeps_every_pinned_model() -> None:
    role = GroupRole(settings(**{**GROUP, "SIE_NODE_RANK": "0"}), stop=lambda: None)
    role.require_leader()
    assert role.keeps_pinned(served(2))
    assert role.keeps_pinned(served(4))
    assert role.probe_fields()["rank"] == 0


def test_one_node_adds_nothing() -> None:
    role = GroupRole(settings(), stop=lambda: None)
    role.require_leader()
    assert role.probe_fields() == {}
    assert not role.serves_group(served(4))


def test_a_group_engine_ending_stops_the_worker_once_with_its_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stops: list[int] = []
    role = GroupRole(settings(**GROUP), stop=lambda: stops.append(1))
    role.engine_failed("org/w4", "engine exited with code 1")
    role.engine_failed("org/w4", "again")
    assert stops == [1]
    assert role.exit_status == GROUP_EXIT_STATUS
    assert "restarts whole" in caplog.text
