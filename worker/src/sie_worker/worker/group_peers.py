"""Where the other ranks of this worker's group of nodes are, and when one counts as gone.
Pure.

A rank's engine cannot always tell that a peer is gone: a real vLLM leader whose follower's
engine was killed keeps answering ``/health`` and hangs every request. So each rank watches
the other ranks' workers instead (their ``/readyz``, :mod:`~sie_worker.worker.group_watch`),
at these addresses:

- ``SIE_NODE_ADDRESSES`` when set: one address per rank, rank 0 first, ``host`` or
  ``host:port`` (the port defaults to this worker's own, as every pod of a group serves on
  the same port);
- else, on a LeaderWorkerSet, from the leader's address: ``LWS_LEADER_ADDRESS`` is
  ``<leader pod>.<service>.<namespace>`` and rank K's pod is ``<leader pod>-K`` beside it;
- else (an IP address or another name as ``SIE_LEADER_ADDRESS``) none: the ranks cannot
  watch each other and say so at start.

A peer counts as gone once it has answered ready and then fails :data:`LOST_AFTER` probes in
a row (no answer, or not 200: a worker whose engine rank ended drains, then exits). A peer
that never answered ready is not watched: the group's engine cannot be ready without it, and
its load fails on its own start-up budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sie_worker.settings import Settings, split_address

__all__ = [
    "LOST_AFTER",
    "PROBE_INTERVAL_S",
    "PeerWatch",
    "lws_addresses",
    "peer_urls",
    "rank_hosts",
]

PROBE_INTERVAL_S = 2.0
LOST_AFTER = 3
# A LeaderWorkerSet leader pod: <set name>-<group index>.
_LEADER_POD = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9]+$")


def lws_addresses(leader: str, nodes: int) -> tuple[str, ...] | None:
    """Every rank's host on a LeaderWorkerSet, derived from the leader's address; None when
    it is no leader pod's DNS name."""
    pod, dot, rest = leader.partition(".")
    if not dot or not rest or not _LEADER_POD.match(pod):
        return None
    return (leader, *(f"{pod}-{rank}.{rest}" for rank in range(1, nodes)))


def rank_hosts(settings: Settings) -> tuple[str, ...] | None:
    """Every rank's host, rank 0 first (``SIE_NODE_ADDRESSES``, else the LeaderWorkerSet's
    names); None when they are not known, () outside a group."""
    if settings.nodes < 2 or settings.leader_address is None:
        return ()
    addresses = settings.node_addresses or lws_addresses(settings.leader_address, settings.nodes)
    if addresses is None:
        return None
    hosts = []
    for address in addresses:
        split = split_address(address)
        if split is None:
            return None
        hosts.append(split[0])
    return tuple(hosts)


def peer_urls(settings: Settings) -> dict[int, str] | None:
    """``{rank: base URL}`` of every other rank's worker; None when the addresses are not
    known (see the module docstring)."""
    if settings.nodes < 2 or settings.leader_address is None:
        return {}
    addresses = settings.node_addresses or lws_addresses(settings.leader_address, settings.nodes)
    if addresses is None:
        return None
    urls: dict[int, str] = {}
    for rank, address in enumerate(addresses):
        if rank == settings.node_rank:
            continue
        split = split_address(address)
        if split is None:  # Settings checked SIE_NODE_ADDRESSES; a derived name is a host
            return None
        host, port = split
        host = f"[{host}]" if ":" in host else host
        urls[rank] = f"http://{host}:{port if port is not None else settings.port}"
    return urls


@dataclass
class PeerWatch:
    """Which peers have answered ready, and how many probes each has failed since."""

    ranks: tuple[int, ...]
    lost_after: int = LOST_AFTER
    _seen: set[int] = field(default_factory=set)
    _failed: dict[int, int] = field(default_factory=dict)

    def observe(self, rank: int, ready: bool) -> bool:
        """Record one probe of ``rank``; True when that peer is now gone."""
        if ready:
            self._seen.add(rank)
            self._failed[rank] = 0
            return False
        if rank not in self._seen:
            return False
        self._failed[rank] = self._failed.get(rank, 0) + 1
        return self._failed[rank] >= self.lost_after

    def watched(self, rank: int) -> bool:
        """Whether ``rank`` has answered ready (and so is watched)."""
        return rank in self._seen
