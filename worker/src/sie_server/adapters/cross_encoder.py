"""``sie_server.adapters.cross_encoder:CrossEncoderAdapter``
(the default engine).

SIE's sentence-transformers CrossEncoder scorer; max_length bounds the pair's tokens.
attn_implementation picks SIE's attention kernel and has no effect here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.transformers import SieTransformersAdapter

__all__ = ["CrossEncoderAdapter"]


class CrossEncoderAdapter(SieTransformersAdapter):
    """SIE's adapter, served by the default engine (score)."""

    served_task: ClassVar[Task] = "score"
    sie_options = (
        "trust_remote_code",
        "max_length",
        "compute_precision",
        "attn_implementation",
        "revision",
    )
    engine_options: ClassVar[Mapping[str, str]] = {"max_length": "--context-length"}
    defaults: ClassVar[Mapping[str, Any]] = {}
