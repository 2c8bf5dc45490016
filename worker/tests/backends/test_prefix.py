"""The prompt-prefix index: bounded, forgets tails first, finds each backend's longest prefix,
and hashes chats and prompts alike."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from sie_worker.backends.prefix import (
    PrefixIndex,
    PrefixMatch,
    best_of,
    block_hashes,
    prompt_text,
)


class Reference:
    """The index's rules written the slow, obvious way: a list, oldest first."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self.entries: list[tuple[int, dict[Hashable, int]]] = []
        self.seq = 0

    def record(self, blocks: Sequence[int], backend: Hashable) -> None:
        if self.max_blocks == 0 or not blocks:
            return
        self.seq += 1
        for block in reversed(blocks[: self.max_blocks]):
            held = next((e for b, e in self.entries if b == block), None)
            self.entries = [(b, e) for b, e in self.entries if b != block]
            self.entries.append((block, {**(held or {}), backend: self.seq}))
        self.entries = self.entries[max(0, len(self.entries) - self.max_blocks) :]

    def match(self, blocks: Sequence[int]) -> dict[Hashable, PrefixMatch]:
        found: dict[Hashable, PrefixMatch] = {}
        known = dict(self.entries)
        for depth, block in enumerate(blocks, 1):
            if block not in known:
                break
            for backend, seq in known[block].items():
                found[backend] = PrefixMatch(depth, seq)
        return found


# Prompts are chains over a small alphabet of blocks, so they share prefixes often.
_prompts = st.lists(st.integers(0, 3), min_size=0, max_size=8).map(
    lambda path: block_hashes("m", "".join(f"{p:04d}" for p in path), 4)
)
_ops = st.lists(st.tuples(_prompts, st.sampled_from(["p0", "p1", "p2"])), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops=_ops, probe=_prompts, max_blocks=st.integers(0, 12))
def test_the_index_agrees_with_the_obvious_one_and_stays_within_its_bound(
    ops: list[tuple[tuple[int, ...], str]], probe: tuple[int, ...], max_blocks: int
) -> None:
    index, reference = PrefixIndex(max_blocks), Reference(max_blocks)
    for blocks, backend in ops:
        index.record(blocks, backend)
        reference.record(blocks, backend)
        assert len(index) <= max_blocks
        assert [b for b, _ in reference.entries] == list(index._blocks)
    assert index.match(probe) == reference.match(probe)


@given(ops=_ops)
def test_a_backend_just_sent_a_prompt_holds_all_of_it_most_recently(
    ops: list[tuple[tuple[int, ...], str]],
) -> None:
    index = PrefixIndex(64)
    for blocks, backend in ops:
        index.record(blocks, backend)
        if blocks:
            found = index.match(blocks)
            assert found[backend].blocks == len(blocks)
            assert found[backend].seq == max(m.seq for m in found.values())


def test_a_prompts_tail_is_forgotten_before_its_start() -> None:
    old = block_hashes("m", "a" * 40, 10)  # 4 blocks
    new = block_hashes("m", "b" * 30, 10)  # 3 blocks
    index = PrefixIndex(5)
    index.record(old, "p0")
    index.record(new, "p1")
    assert [b in index for b in old] == [True, True, False, False]
    assert index.match((*old, 1)) == {"p0": PrefixMatch(2, 1)}


def test_the_longest_prefix_wins_and_forgetting_a_backend_drops_it_everywhere() -> None:
    system = "s" * 100
    short = block_hashes("m", system + "turn one", 10)
    long = block_hashes("m", system + "turn one" + "x" * 50, 10)
    index = PrefixIndex(100)
    index.record(short, "p0")
    index.record(long, "p1")
    later = block_hashes("m", system + "turn one" + "x" * 50 + "turn two" * 5, 10)
    assert index.match(later) == {"p0": PrefixMatch(10, 1), "p1": PrefixMatch(15, 2)}
    index.forget("p1")
    assert index.match(later) == {"p0": PrefixMatch(10, 1)}
    assert len(index) == 10
    # Another model's prompt with the same text shares nothing.
    assert index.match(block_hashes("other", system, 10)) == {}


_text = st.text(alphabet="ab\n", max_size=40)
_messages = st.lists(
    st.tuples(st.sampled_from(["system", "user", "assistant"]), _text), min_size=1, max_size=4
)


@given(messages=_messages, more=_messages, block=st.integers(1, 8))
def test_a_chat_hashes_as_its_rendered_prompt_and_a_longer_chat_extends_its_blocks(
    messages: list[tuple[str, str]], more: list[tuple[str, str]], block: int
) -> None:
    chat = {"messages": [{"role": r, "content": c} for r, c in messages]}
    text = prompt_text(chat)
    assert text is not None
    assert block_hashes("m", text, block) == block_hashes(
        "m", prompt_text({"prompt": text}) or "", block
    )
    # Content given as parts hashes as the same text.
    parts = {
        "messages": [{"role": r, "content": [{"type": "text", "text": c}]} for r, c in messages]
    }
    assert prompt_text(parts) == text
    longer = {"messages": chat["messages"] + [{"role": r, "content": c} for r, c in more]}
    grown = block_hashes("m", prompt_text(longer) or "", block)
    mine = block_hashes("m", text, block)
    assert grown[: len(mine)] == mine


def test_requests_without_a_prompt_have_no_text() -> None:
    assert prompt_text(None) is None
    assert prompt_text({"input": "embed me"}) is None
    assert prompt_text({"prompt": ["a", "b"]}) is None  # a batch: no one prefix
    assert prompt_text({"prompt": [[1, 2, 3]]}) == "1,2,3"
    assert prompt_text({"messages": ["not a message"]}) is None


@settings(max_examples=300, deadline=None)
@given(ops=_ops, probe=_prompts, allowed=st.sets(st.sampled_from(["p0", "p1", "p2"])))
def test_the_best_eligible_backend_is_the_longest_then_newest_match(
    ops: list[tuple[tuple[int, ...], str]], probe: tuple[int, ...], allowed: set[str]
) -> None:
    index = PrefixIndex(10)
    for blocks, backend in ops:
        index.record(blocks, backend)
    assert index.hits(probe).best(allowed) == best_of(index.match(probe), allowed)
