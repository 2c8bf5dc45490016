"""Pool choice: which pool x bundles may serve a request, and what routing needs to know
of it (:class:`Selection`: the model, its width, the session key).

:func:`select_pools`: ``X-SIE-Pool`` names a pool (case-insensitive);
``X-SIE-MACHINE-PROFILE`` (what ``gpu="l4-4x"`` sends) matches pools by machine profile,
else by GPU type. Either unmatched: 404 ``unknown_pool`` listing the pools. Of those left,
the pools whose bundle runs the model's adapter and whose slots are as wide as the model
may serve it; none: 409 ``no_pool`` saying why for each. A model no config ships and no
pod lists (when the configs, or every pool's pods, can say) is 404 ``unknown_model``, as
the worker and the slot router answer it.

The model's width (:func:`model_width`) is its config's ``tensor_parallel_size`` when the
gateway has the shipped configs, else the widest any pod lists for it: a pool whose slots
are narrower is never a candidate, whether or not its pods list the model (they would
refuse it with ``invalid_config``), and neither is a pod whose slots are
(:func:`~sie_worker.gateway.policy.choose`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sie_worker.backends.routed import RoutedRequest
from sie_worker.errors import NoPool, UnknownModel, UnknownPool
from sie_worker.gateway.catalogue import Catalogue
from sie_worker.gateway.pools import PoolKey, PoolSpec
from sie_worker.gateway.state import Fleet

__all__ = ["Selection", "model_width", "select_pools", "selection"]


def selection(
    specs: Sequence[PoolSpec],
    catalogue: Catalogue,
    fleet: Fleet,
    request: RoutedRequest,
    headers: Mapping[str, str],
) -> Selection:
    """Everything routing needs of a request (raises the refusals of :func:`select_pools`)."""
    model = request.model or ""
    width = model_width(catalogue, fleet, model)
    groups = select_pools(
        specs,
        catalogue,
        fleet.listings(),
        model,
        width=width,
        pool=headers.get("x-sie-pool"),
        profile=headers.get("x-sie-machine-profile"),
    )
    return Selection(model, width, tuple(groups), request.session, request.prefix, request.adapter)


def model_width(catalogue: Catalogue, fleet: Fleet, model: str) -> int:
    """GPUs per slot the model needs: its config's, else the widest any pod lists."""
    info = catalogue.models.get(model)
    if info is not None:
        return info.width
    return fleet.width_of(model) or 1


@dataclass(frozen=True)
class Selection:
    """A request's model, the pool x bundles that may serve it (in order), its session
    key, its prompt's prefix blocks and its LoRA adapter."""

    model: str
    width: int
    groups: tuple[PoolKey, ...]
    session: str | None = None
    # The prompt's prefix block hashes (sie_worker.backends.prefix); empty: none, or off.
    prefix: tuple[int, ...] = ()
    adapter: str | None = None  # the LoRA adapter it names (pods serving it first)


def _describe_pools(specs: Sequence[PoolSpec]) -> str:
    pools: dict[str, PoolSpec] = {}
    for spec in specs:
        pools.setdefault(spec.pool, spec)
    return ", ".join(
        f"{name} (machine profile {s.machine_profile}, GPU type {s.gpu_type})"
        for name, s in sorted(pools.items())
    )


def select_pools(
    specs: Sequence[PoolSpec],
    catalogue: Catalogue,
    listings: Mapping[PoolKey, frozenset[str] | None],
    model: str,
    *,
    width: int = 1,
    pool: str | None = None,
    profile: str | None = None,
) -> list[PoolKey]:
    """The pool x bundles that may serve ``model`` (``width`` GPUs per slot), in
    pools-file order.

    ``listings`` has, per pool x bundle, the models its polled pods list (None while none
    was polled). Raises :class:`UnknownPool`, :class:`NoPool` or :class:`UnknownModel`.
    """
    candidates = list(specs)
    pool = pool.strip() if pool else None
    profile = profile.strip() if profile else None
    if pool:
        candidates = [s for s in candidates if s.pool.lower() == pool.lower()]
        if not candidates:
            raise UnknownPool(
                f"X-SIE-Pool: no pool is named {pool!r}; the pools are {_describe_pools(specs)}"
            )
    if profile:
        named = candidates
        candidates = [s for s in named if s.matches_profile(profile)] or [
            s for s in named if s.matches_gpu_type(profile)
        ]
        if not candidates:
            within = f"pool {pool!r}" if pool else "no pool"
            raise UnknownPool(
                f"X-SIE-MACHINE-PROFILE: {within} has machine profile or GPU type "
                f"{profile!r}; the pools are {_describe_pools(specs)}"
            )
    listed_anywhere = any(model in (m or ()) for m in listings.values())
    # Unknown: neither shipped nor listed, where the configs or every pool's pods can say.
    every_pool_says = bool(listings) and all(m is not None for m in listings.values())
    knowable = catalogue.complete or every_pool_says
    if knowable and model not in catalogue.models and not listed_anywhere:
        shown = sorted({*catalogue.models, *(m for ms in listings.values() for m in ms or ())})
        more = f" and {len(shown) - 20} more" if len(shown) > 20 else ""
        raise UnknownModel(
            f"model {model!r} is not configured in any pool; configured models: "
            f"{', '.join(shown[:20]) or 'none'}{more}"
        )
    eligible: list[PoolKey] = []
    reasons: list[str] = []
    for spec in candidates:
        why = catalogue.fit(model, spec, width)  # whatever its pods list
        listed = listings.get(spec.key)
        unlisted = listed is not None and model not in listed
        if why is None and model not in catalogue.models and unlisted:
            why = f"pool {spec.pool}, bundle {spec.bundle}: its pods do not serve {model}"
        if why is None:
            eligible.append(spec.key)
        else:
            reasons.append(why)
    if not eligible:
        scope = "the pools the request names" if pool or profile else "any pool"
        raise NoPool(f"{scope} cannot serve {model}: " + "; ".join(reasons))
    return eligible
