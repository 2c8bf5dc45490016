"""The LoRA affinity scorer (pure): a backend serving the request's adapter now sorts first."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sie_worker.backends.lora_affinity import adapter_miss

ADAPTERS = ("sql", "chat", "code")


@given(st.frozensets(st.sampled_from(ADAPTERS)), st.none() | st.sampled_from(ADAPTERS))
def test_a_backend_misses_an_adapter_exactly_when_one_is_asked_and_not_served(
    loaded: frozenset[str], adapter: str | None
) -> None:
    assert adapter_miss(loaded, adapter) == (0 if adapter is None or adapter in loaded else 1)


def test_a_request_without_an_adapter_ranks_every_backend_alike() -> None:
    assert {adapter_miss(loaded, None) for loaded in (frozenset(), frozenset(ADAPTERS))} == {0}
