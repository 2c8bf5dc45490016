"""Which served model a request names: the one model-id rule of the worker, the slot router
and the gateway, for OpenAI bodies and SIE paths alike. Pure.

sie-sdk puts the model in the path: raw for encode, score and ``GET /v1/models/{model}``
(``BAAI/bge-m3``), with ``/`` written ``__`` for generate (``Qwen__Qwen3-4B``). Either may
end in ``:<profile>``, and encode, generate (``options.profile``) and score
(``options.profile``) may name the profile in the body instead. SIE's rules:

- the exact id first; ``<id>:default`` is ``<id>``;
- for generate, then the id with ``__`` turned back into ``/``;
- then a case-insensitive match, when exactly one served id matches; several: 400
  ``ambiguous_model`` naming them (:class:`~sie_worker.errors.AmbiguousModel`);
- none: the caller answers 404 ``unknown_model``, the same code at every hop;
- on the OpenAI routes, SGLang's ``<served id>:<adapter>`` (:func:`split_model`) names a
  LoRA adapter of a served model;
- a profile in the body applies to an id that names none; naming two different
  profiles is refused.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from sie_worker.config.model import DEFAULT_PROFILE
from sie_worker.errors import AmbiguousModel, InvalidRequest

__all__ = ["AnyOf", "resolve_model_id", "served_or_asked", "split_model", "with_profile"]


def with_profile(asked: str, profile: str | None, *, field: str = "options.profile") -> str:
    """``asked`` with the body's profile applied (:class:`InvalidRequest` if both differ)."""
    if profile is None or profile == "":
        return asked
    base, sep, named = asked.partition(":")
    if sep and named not in (profile, ""):
        raise InvalidRequest(
            f"{field}: the path names profile {named!r} and the body {profile!r}; name one",
            param=field,
        )
    return base if profile == DEFAULT_PROFILE else f"{base}:{profile}"


def resolve_model_id(asked: str, known: Collection[str], *, generate: bool = False) -> str | None:
    """The served id among ``known`` that ``asked`` names, or None; :class:`AmbiguousModel`
    when several match but only if case is ignored."""
    spellings = _spellings(asked, generate)
    for candidate in spellings:
        if candidate in known:
            return candidate
    for candidate in spellings:
        folded = candidate.casefold()
        matches = [k for k in known if k.casefold() == folded]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise AmbiguousModel.among(asked, matches)
    return None


def _spellings(asked: str, generate: bool) -> list[str]:
    default_suffix = ":" + DEFAULT_PROFILE
    bare = asked[: -len(default_suffix)] if asked.endswith(default_suffix) else asked
    spellings = [asked, bare]
    if generate:
        spellings += [s.replace("__", "/") for s in (asked, bare)]
    return list(dict.fromkeys(spellings))


def served_or_asked(asked: str, known: Collection[str], *, generate: bool = False) -> str:
    """The served id ``asked`` names among ``known`` (:func:`resolve_model_id`); unknown:
    as asked, without ``:default`` (generate: ``__`` as ``/``), for the hop that knows
    every id (a worker, or a gateway with the shipped configs) to answer ``unknown_model``."""
    if asked in known:
        return asked  # the usual case
    found = resolve_model_id(asked, known, generate=generate)
    if found is not None:
        return found
    bare = asked.removesuffix(":" + DEFAULT_PROFILE)
    return bare.replace("__", "/") if generate else bare


class AnyOf(Collection[str]):
    """The ids of several collections as one, without copying them (the gateway's shipped
    configs and what its pods list)."""

    def __init__(self, *parts: Collection[str]) -> None:
        self.parts = parts

    def __contains__(self, item: object) -> bool:
        return any(item in part for part in self.parts)

    def __iter__(self) -> Iterator[str]:
        seen: set[str] = set()
        for part in self.parts:
            for item in part:
                if item not in seen:
                    seen.add(item)
                    yield item

    def __len__(self) -> int:
        return sum(1 for _ in self)


def split_model(named: str, served_ids: Iterable[str]) -> tuple[str, str] | None:
    """``(served id, adapter)`` when ``named`` is ``<served id>:<adapter>`` and not a served id
    itself (SGLang's rule: the longest served id that prefixes it); else None."""
    if ":" not in named:
        return None  # checked first: most requests name no adapter, and ids can be many
    ids = set(served_ids)
    if named in ids:
        return None
    bases = [i for i in ids if named.startswith(f"{i}:") and named[len(i) + 1 :].strip()]
    if not bases:
        return None
    base = max(bases, key=len)
    return base, named[len(base) + 1 :].strip()
