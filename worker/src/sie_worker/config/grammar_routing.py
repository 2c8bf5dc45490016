"""Which profile of a model answers a grammar-constrained request. Pure.

Speculative decoding bypasses SGLang's grammar backend, so a model may name a profile
that enforces grammars: ``tasks.generate.grammar_profile`` (also written top-level) for the
model, or a profile-scoped ``grammar_profile`` for one variant. A grammar request sent to
profile P (``default`` for ``<sie_id>``) stays on P when P can already enforce it, else
moves to the grammar profile, following SIE's rules:

- a model without a grammar profile keeps the request where it was sent;
- the grammar profile itself, and any profile another profile names as its grammar
  profile, keep it;
- a variant with its own ``grammar_profile`` sends it there;
- a variant that is grammar-compatible with its parent's grammar profile, or that extends
  the model's grammar profile and is compatible with it, keeps it;
- the default profile keeps it when it is compatible with the model's grammar profile;
- anything else goes to the model's grammar profile.

Compatible means: the same adapter, speculation explicitly off (``speculative: {enabled:
false}`` and no ``--speculative-*`` flag in the launch arguments), the same
``grammar_backend``, and the same launch arguments (or exactly ``--quantization fp8``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sie_worker.config.model import DEFAULT_PROFILE, ModelConfig, Profile

__all__ = ["grammar_compatible", "grammar_profile_for"]

_RAW_SPECULATIVE_FLAGS = frozenset({"--enable-multi-layer-eagle", "--config"})
_GRAMMAR_SAFE_ARGS = ("--quantization", "fp8")


def grammar_profile_for(config: ModelConfig, profile: str) -> str:
    """The profile that answers a grammar-constrained request sent to ``profile``."""
    profiles = config.profiles
    source = profiles.get(profile)
    if source is None:
        return profile
    if any(p.grammar_profile == profile for p in profiles.values()):
        return profile
    if profile != DEFAULT_PROFILE and source.grammar_profile is not None:
        return source.grammar_profile
    parent = profiles.get(source.extends) if source.extends else None
    if (
        profile != DEFAULT_PROFILE
        and parent is not None
        and parent.grammar_profile is not None
        and _compatible(profiles, profile, parent.grammar_profile)
    ):
        return profile
    target = config.grammar_profile
    if target is None or target == profile:
        return profile
    if profile == DEFAULT_PROFILE or source.extends == target:
        return profile if _compatible(profiles, profile, target) else target
    return target


def grammar_compatible(candidate: Profile, grammar: Profile) -> bool:
    """Whether ``candidate`` enforces grammars as ``grammar`` does (see the module doc)."""
    speculative = candidate.loadtime.get("speculative")
    return (
        candidate.adapter_path == grammar.adapter_path
        and isinstance(speculative, Mapping)
        and speculative.get("enabled") is False
        and not any(_speculative_flag(arg) for arg in candidate.extra_launch_args)
        and candidate.loadtime.get("grammar_backend") == grammar.loadtime.get("grammar_backend")
        and (
            candidate.extra_launch_args == grammar.extra_launch_args
            or candidate.extra_launch_args == _GRAMMAR_SAFE_ARGS
        )
    )


def _compatible(profiles: Mapping[str, Profile], candidate: str, grammar: str) -> bool:
    if candidate not in profiles or grammar not in profiles:
        return False
    return grammar_compatible(profiles[candidate], profiles[grammar])


def _speculative_flag(arg: str) -> bool:
    flag = arg.split("=", 1)[0]
    return flag.startswith("--speculative-") or flag in _RAW_SPECULATIVE_FLAGS
