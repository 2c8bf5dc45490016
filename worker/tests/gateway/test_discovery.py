"""EndpointSlices to pods: ready endpoints only, named after their pods, on the http port."""

from __future__ import annotations

from lightkube.models.core_v1 import ObjectReference
from lightkube.models.discovery_v1 import Endpoint, EndpointConditions, EndpointPort
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.discovery_v1 import EndpointSlice

from sie_worker.gateway.discovery import local_endpoints, slice_endpoints
from sie_worker.gateway.pools import PoolSpec
from sie_worker.gateway.state import Endpoint as Pod


def _endpoint(address: str, pod: str | None, **conditions: bool) -> Endpoint:
    ref = ObjectReference(kind="Pod", name=pod) if pod else None
    return Endpoint(addresses=[address], conditions=EndpointConditions(**conditions), targetRef=ref)


def test_ready_endpoints_become_pods_on_the_http_port() -> None:
    first = EndpointSlice(
        metadata=ObjectMeta(name="svc-abc"),
        addressType="IPv4",
        ports=[EndpointPort(name="http", port=8080)],
        endpoints=[
            _endpoint("10.1.0.5", "pool-7f9-x2", ready=True),
            _endpoint("10.1.0.6", "pool-7f9-y3", ready=False),
            _endpoint("10.1.0.7", "pool-7f9-z4", ready=True, terminating=True),
        ],
    )
    second = EndpointSlice(
        metadata=ObjectMeta(name="svc-def"),
        addressType="IPv6",
        ports=[EndpointPort(name="http", port=9000)],
        endpoints=[_endpoint("fd00::1", None)],
    )
    assert slice_endpoints([first, second], default_port=8080) == [
        Pod("fd00::1", "http://[fd00::1]:9000"),
        Pod("pool-7f9-x2", "http://10.1.0.5:8080"),
    ]


def test_a_slice_without_ports_uses_the_pools_file_port_and_none_lists_nothing() -> None:
    bare = EndpointSlice(
        metadata=ObjectMeta(name="svc"), addressType="IPv4", endpoints=[_endpoint("10.0.0.1", "p")]
    )
    assert slice_endpoints([bare], default_port=8080) == [Pod("p", "http://10.0.0.1:8080")]
    assert slice_endpoints([bare], default_port=None) == []
    assert slice_endpoints([], default_port=8080) == []


def test_local_endpoints_are_named_after_their_pool_and_bundle() -> None:
    spec = PoolSpec("dev", "default", "cpu", "cpu", endpoints=("http://a:1", "http://b:2"))
    assert local_endpoints(spec) == [
        Pod("dev-default-0", "http://a:1"),
        Pod("dev-default-1", "http://b:2"),
    ]
