"""SIE's native HTTP API (what sie-sdk calls), translated to and from the engines' OpenAI API.

Pure: each route's module reads SIE's request (:mod:`.encode`, :mod:`.score`,
:mod:`.generate`), says which engine request serves it (an :class:`~.call.EngineCall`) and
turns the engine's answer, or its stream, back into SIE's shape. The worker serves them on
the same request path as the OpenAI routes (placement, loading, leases, metrics, errors).
"""
