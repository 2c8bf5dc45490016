"""Prompt-prefix index: which backend served which prompt prefixes, bounded in size.

A prompt (a completion's ``prompt``, or a chat's ``messages`` rendered one way) is cut into
blocks of ``block_chars`` characters; block *i*'s hash covers the model and every block up
to *i* (a chain, as engines hash their KV blocks), so equal hashes mean equal prefixes. Only
full blocks count: an engine caches whole blocks too. The index maps each block hash to the
backends that were sent it, with the sequence number of the latest such request, and keeps
at most ``max_blocks`` hashes: past that, the least recently recorded go first, and since a
request's blocks are recorded last to first, a prompt's tail is forgotten before its start.

Hashes are Python's own (``hash``): the index lives in one process, and they are fast.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_BLOCK_CHARS",
    "DEFAULT_INDEX_BLOCKS",
    "PrefixConfig",
    "PrefixHits",
    "PrefixIndex",
    "PrefixMatch",
    "PrefixPick",
    "best_of",
    "block_hashes",
    "prompt_blocks",
    "prompt_text",
]

# 256 characters is about 64 tokens: a few of an engine's KV blocks (16 tokens in vLLM).
DEFAULT_BLOCK_CHARS = 256
# 32,768 block hashes: 8 MiB of prompt text seen, about 10 MiB of index (measured:
# docs/benchmarks.md, "Prefix-aware routing").
DEFAULT_INDEX_BLOCKS = 32768


@dataclass(frozen=True)
class PrefixConfig:
    """``block_chars`` characters per block; ``index_blocks`` hashes kept (0: off)."""

    block_chars: int = DEFAULT_BLOCK_CHARS
    index_blocks: int = DEFAULT_INDEX_BLOCKS

    @property
    def enabled(self) -> bool:
        return self.index_blocks > 0


# What a policy asks of a prompt's matches: the best backend among those it may use.
PrefixPick = Callable[[Container[Hashable]], Hashable | None]


class PrefixMatch(NamedTuple):
    """A backend's cached prefix of one prompt: its length in blocks and how recent it is
    (a tuple: a match builds one per backend, on every request)."""

    blocks: int
    seq: int


def prompt_text(payload: Mapping[str, Any] | None) -> str | None:
    """The text a request's prompt starts with: a chat's messages (each as ``role``, a
    newline, its text, a blank line; content parts' texts joined), else a completion's
    ``prompt`` (a string, or one string or token list in a list). None when it has neither."""
    if payload is None:
        return None
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                return None
            parts.append(f"{message.get('role', '')}\n{_content_text(message.get('content'))}\n\n")
        return "".join(parts)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return ",".join(map(str, prompt))  # token ids: prefixes of the list stay prefixes
    return None


def prompt_blocks(
    config: PrefixConfig, model: str, payload: Mapping[str, Any] | None
) -> tuple[int, ...]:
    """The block hashes of a request's prompt (:func:`prompt_text`); () when it has none or
    prefix-aware routing is off."""
    text = prompt_text(payload) if config.enabled else None
    return block_hashes(model, text, config.block_chars) if text else ()


def block_hashes(model: str, text: str, block_chars: int) -> tuple[int, ...]:
    """One chained hash per full block of ``text`` (the model's name starts the chain)."""
    h = hash(model)
    out: list[int] = []
    for start in range(0, len(text) - block_chars + 1, block_chars):
        h = hash((h, text[start : start + block_chars]))
        out.append(h)
    return tuple(out)


class PrefixIndex:
    """Block hashes → the backends sent them, at most ``max_blocks`` hashes."""

    def __init__(self, max_blocks: int) -> None:
        if max_blocks < 0:
            raise ValueError(f"max_blocks must be 0 or more, got {max_blocks}")
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, dict[Hashable, int]] = OrderedDict()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def hits(self, blocks: Sequence[int]) -> PrefixHits:
        """What the index holds of ``blocks``: each backend's longest prefix, read lazily."""
        # The blocks present always form a prefix of any recorded prompt, and a backend in
        # block k's entry is in every earlier block's (records touch a prompt's blocks last
        # to first, and forget() drops a backend everywhere), so the walk stops at the
        # first miss and a backend's depth is that of the deepest entry naming it.
        entries: list[dict[Hashable, int]] = []
        get = self._blocks.get
        for block in blocks:
            entry = get(block)
            if entry is None:
                break
            entries.append(entry)
        return PrefixHits(entries)

    def match(self, blocks: Sequence[int]) -> dict[Hashable, PrefixMatch]:
        """Each backend holding a prefix of ``blocks``: its longest, from the first block."""
        return self.hits(blocks).all()

    def record(self, blocks: Sequence[int], backend: Hashable) -> None:
        """``backend`` was sent a prompt of ``blocks``: it holds them now, most recently."""
        if self.max_blocks == 0 or not blocks:
            return
        self._seq += 1
        index = self._blocks
        # Last to first: the start of a prompt is the most recently recorded, evicted last.
        for block in reversed(blocks[: self.max_blocks]):
            entry = index.get(block)
            if entry is None:
                index[block] = {backend: self._seq}
            else:
                entry[backend] = self._seq
                index.move_to_end(block)
        while len(index) > self.max_blocks:
            index.popitem(last=False)

    def forget(self, backend: Hashable) -> None:
        """``backend`` left (or lost its cache): nothing is routed to it for a prefix."""
        emptied = []
        for block, entry in self._blocks.items():
            entry.pop(backend, None)
            if not entry:
                emptied.append(block)
        for block in emptied:
            del self._blocks[block]


class PrefixHits:
    """One prompt's matches: the index entries of its cached blocks, deepest last."""

    __slots__ = ("_entries",)

    def __init__(self, entries: list[dict[Hashable, int]]) -> None:
        self._entries = entries

    def __bool__(self) -> bool:
        return bool(self._entries)

    def best(self, eligible: Container[Hashable]) -> Hashable | None:
        """The eligible backend with the longest prefix (ties: the most recent); None when
        no eligible backend holds any. Walks from the deepest block, so the usual case (one
        backend holds the conversation) looks at a handful of entries."""
        rejected: set[Hashable] = set()
        for entry in reversed(self._entries):
            found: Hashable | None = None
            newest = -1
            for backend, seq in entry.items():
                if backend in rejected:
                    continue
                if backend in eligible:
                    if seq > newest:
                        found, newest = backend, seq
                else:
                    rejected.add(backend)
            if found is not None:
                return found
        return None

    def all(self) -> dict[Hashable, PrefixMatch]:
        """Every backend's longest prefix."""
        found: dict[Hashable, PrefixMatch] = {}
        for depth in range(len(self._entries), 0, -1):
            for backend, seq in self._entries[depth - 1].items():
                if backend not in found:
                    found[backend] = PrefixMatch(depth, seq)
        return found


def best_of(
    matches: Mapping[Hashable, PrefixMatch], eligible: Container[Hashable]
) -> Hashable | None:
    """:meth:`PrefixHits.best` over matches given as a mapping (a policy's tests, the sims)."""
    ranked = [(m.blocks, m.seq, b) for b, m in matches.items() if b in eligible]
    if not ranked:
        return None
    top = max((blocks, seq) for blocks, seq, _ in ranked)
    return min((b for blocks, seq, b in ranked if (blocks, seq) == top), key=repr)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""
