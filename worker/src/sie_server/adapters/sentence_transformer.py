"""``sie_server.adapters.sentence_transformer:SentenceTransformerDenseAdapter``
(the default engine).

SIE's sentence-transformers dense embedder. The checkpoint's own modules pool, as in SIE (a
runtime pooling is read and ignored there too); normalize (default true), the query and
document templates and the default instruction apply as in SIE.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sie_server.adapters.base import Task
from sie_server.adapters.transformers import SieTransformersAdapter

__all__ = ["SentenceTransformerDenseAdapter"]


class SentenceTransformerDenseAdapter(SieTransformersAdapter):
    """SIE's adapter, served by the default engine (encode)."""

    served_task: ClassVar[Task] = "encode"
    sie_options = (
        "trust_remote_code",
        "normalize",
        "max_seq_length",
        "compute_precision",
        "config_kwargs",
        "revision",
        "query_template",
        "doc_template",
        "default_instruction",
        "pooling",
    )
    engine_options: ClassVar[Mapping[str, str]] = {
        "normalize": "--no-normalize",
        "query_template": "--query-template",
        "doc_template": "--doc-template",
        "default_instruction": "--default-instruction",
    }
    defaults: ClassVar[Mapping[str, Any]] = {}
