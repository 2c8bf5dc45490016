"""The pools file: every problem reported at once, naming the entry, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sie_worker.gateway.pools import PoolKey, PoolsFileError, PoolSpec, parse_pools, read_pools_file

CLUSTER = {
    "pool": "l4-4x",
    "bundle": "sglang",
    "machine_profile": "l4-4x",
    "gpu_type": "l4",
    "slots": 1,
    "slot_width": 4,
    "service": "sie-sie-workers-l4-4x-sglang",
    "port": 8080,
}


def test_a_chart_entry_reads_as_a_pool_spec() -> None:
    (spec,) = parse_pools([CLUSTER])
    assert spec == PoolSpec(
        "l4-4x", "sglang", "l4-4x", "l4", 1, 4, "sie-sie-workers-l4-4x-sglang", 8080
    )
    assert spec.key == PoolKey("l4-4x", "sglang")
    assert spec.gpu == "l4-4x"


def test_a_pool_resumes_its_streams_unless_it_says_resume_false() -> None:
    (default,) = parse_pools([CLUSTER])
    assert default.resume is True
    (off,) = parse_pools([CLUSTER | {"resume": False}])
    assert off.resume is False
    with pytest.raises(PoolsFileError, match=r"\$\[0\]\.resume: must be true or false, got 'no'"):
        parse_pools([CLUSTER | {"resume": "no"}])


def test_a_local_entry_lists_endpoints_and_defaults_its_profile_to_the_gpu_type() -> None:
    (spec,) = parse_pools(
        [
            {
                "pool": "dev",
                "bundle": "default",
                "gpu_type": "cpu",
                "endpoints": ["http://127.0.0.1:9001/"],
            }
        ]
    )
    assert spec.endpoints == ("http://127.0.0.1:9001",)
    assert (spec.machine_profile, spec.slots, spec.slot_width) == ("cpu", 1, 1)
    (zero,) = parse_pools(
        [{"pool": "dev", "bundle": "default", "gpu_type": "cpu", "endpoints": []}]
    )
    assert zero.endpoints == ()


def test_every_problem_is_reported_with_its_path_and_fix() -> None:
    bad = [
        {**CLUSTER, "slot_widht": 2, "slots": 0},
        {"pool": "x y", "bundle": "sglang", "gpu_type": "l4"},
        {"pool": "dev", "bundle": "default", "gpu_type": "cpu", "endpoints": ["https://a", "ftp"]},
        {**CLUSTER, "endpoints": ["http://127.0.0.1:1"]},
        {**CLUSTER},
        {**CLUSTER},
        "not a mapping",
    ]
    with pytest.raises(PoolsFileError) as info:
        parse_pools(bad, source="pools.yaml")
    assert info.value.problems == (
        "pools.yaml: $[0].slot_widht: unknown key; did you mean slot_width?",
        "pools.yaml: $[0].slots: must be an integer from 1 to 64, got 0",
        "pools.yaml: $[1].pool: must be a name of letters, digits, '-', '_' and '.', got 'x y'",
        "pools.yaml: $[1].service: is required (the pool x bundle Service) unless endpoints "
        "lists the pod router URLs of a local run; add one of them",
        "pools.yaml: $[2].endpoints[0]: must be a pod router URL like http://127.0.0.1:8080, "
        "got 'https://a'",
        "pools.yaml: $[2].endpoints[1]: must be a pod router URL like http://127.0.0.1:8080, "
        "got 'ftp'",
        "pools.yaml: $[3].endpoints: cannot be given with service: pods come from the "
        "Service's EndpointSlices in a cluster, or from endpoints in a local run; keep one",
        "pools.yaml: $[5].bundle: pool 'l4-4x' with bundle 'sglang' is already entry $[4]; "
        "list each pool x bundle once",
        "pools.yaml: $[6]: must be a mapping, got str",
    )


@pytest.mark.parametrize("data", [None, [], {"pools": []}, "l4"])
def test_a_file_that_is_not_a_list_of_pools_is_refused(data: object) -> None:
    with pytest.raises(PoolsFileError, match=r"\$: must be a non-empty list of pools"):
        parse_pools(data)


def test_reading_a_missing_or_broken_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(PoolsFileError, match="cannot read the pools file"):
        read_pools_file(tmp_path / "missing.yaml")
    broken = tmp_path / "pools.yaml"
    broken.write_text("- pool: [\n")
    with pytest.raises(PoolsFileError, match=r"pools.yaml: \$: is not valid YAML or JSON"):
        read_pools_file(broken)
