"""Hypothesis strategies for model-config fuzzing: JSON-shaped values and valid configs
with a few random changes (values replaced, keys added where the schema has names)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

__all__ = ["CONFIG_KEYS", "json_values", "mutated", "paths_of"]

# Keys the config schema and rules know: new keys are drawn from these, so that a change
# often lands where a rule looks rather than being refused as unknown at once.
CONFIG_KEYS = st.sampled_from(
    [
        "sie_id",
        "hf_id",
        "tasks",
        "profiles",
        "default",
        "fast",
        "extends",
        "adapter_options",
        "loadtime",
        "runtime",
        "tensor_parallel_size",
        "extra_launch_args",
        "extra_env",
        "adapter_path",
        "grammar_profile",
        "generate",
        "encode",
        "model_path",
        "compute_precision",
        # SIE 0.10.1's keys and the places this project's spellings map to.
        "hf_revision",
        "revision",
        "weights_path",
        "max_sequence_length",
        "dense",
        "dim",
        "score",
        "routing",
        "policy",
        "pool",
        "speculative",
        "default_sampling",
        "stop_tokens",
        "overall_timeout_s",
        "chat_template_kwargs",
        "max_output_tokens",
    ]
)


def json_values(
    leaf: st.SearchStrategy[Any], *, max_size: int, max_leaves: int
) -> st.SearchStrategy[Any]:
    """Nested lists and string-keyed mappings of ``leaf`` values."""
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=max_size),
            st.dictionaries(st.text(max_size=12), inner, max_size=max_size),
        ),
        max_leaves=max_leaves,
    )


def paths_of(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``doc`` (the empty path is the document itself)."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths_of(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += paths_of(value, (*prefix, index))
    return found


@st.composite
def mutated(
    draw: st.DrawFn,
    base: Callable[[], Any],
    values: st.SearchStrategy[Any],
    *,
    min_changes: int,
    max_changes: int,
) -> Any:
    """``base()`` with between ``min_changes`` and ``max_changes`` random changes: a value
    somewhere replaced by one of ``values``, or a new key from :data:`CONFIG_KEYS`."""
    doc: Any = copy.deepcopy(base())
    for _ in range(draw(st.integers(min_value=min_changes, max_value=max_changes))):
        path = draw(st.sampled_from(paths_of(doc)))
        value = draw(values)
        if not path:
            doc = value
            continue
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict) and draw(st.booleans()):
            parent[draw(CONFIG_KEYS)] = value
        else:
            parent[path[-1]] = value
    return doc
