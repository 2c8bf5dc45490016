"""The default engine as an engine family (:class:`~sie_worker.engines.family.EngineFamily`):
``python -m sie_worker.engines.transformers``, one process on one device, bundle ``default``.

Memory: its load-time ``memory_gib`` when declared; else its weight files' bytes x 1.2 + 1 GiB
on CUDA (+ 0.5 GiB more on ``cpu``, where the Python process and torch's CPU allocator count
too). On CUDA it caps its allocator at ``need / total`` (``--cuda-memory-fraction``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sie_worker.engines.family import EngineFamily

if TYPE_CHECKING:
    from sie_server.adapters.base import Adapter
    from sie_worker.config.flags.option_rules import Release
    from sie_worker.config.model import ServedModel
    from sie_worker.engines.family import EngineChecks
    from sie_worker.sizing.memory_needs import EngineShare
    from sie_worker.worker.launcher.argv_inputs import ArgvInputs

__all__ = ["DEFAULT", "DefaultFamily"]

TRANSFORMERS = "sie_server.adapters.transformers:TransformersAdapter"
# SIE's adapters whose models the default transformers engine serves as SIE does.
SIE_TRANSFORMERS_ADAPTERS: tuple[str, ...] = (
    "sie_server.adapters.sentence_transformer:SentenceTransformerDenseAdapter",
    "sie_server.adapters.bert_flash:BertFlashAdapter",
    "sie_server.adapters.xlm_roberta_flash:XLMRobertaFlashAdapter",
    "sie_server.adapters.modernbert_flash:ModernBERTFlashAdapter",
    "sie_server.adapters.bert_flash_cross_encoder:BertFlashCrossEncoderAdapter",
    "sie_server.adapters.cross_encoder:CrossEncoderAdapter",
    "sie_server.adapters.modernbert_flash_cross_encoder:ModernBertFlashCrossEncoderAdapter",
)


@dataclass(frozen=True)
class DefaultFamily(EngineFamily):
    def argv(self, inputs: ArgvInputs) -> tuple[str, ...]:
        from sie_worker.engines.default.argv import default_argv

        return default_argv(inputs)

    def rendezvous(self, declared: int | None, picked: int | None) -> int | None:
        return None  # one process on one device

    def memory_need(
        self,
        total: int | None,
        *,
        on_cpu: bool,
        declared: Mapping[str, Any],
        weights_bytes: int | None,
    ) -> int | None:
        from sie_worker.sizing.memory_needs import weights_need

        return weights_need(declared, weights_bytes, on_cpu=on_cpu)

    def needs_weights(self, *, on_cpu: bool) -> bool:
        return True

    def share(
        self,
        *,
        on_cuda: bool,
        need: int,
        totals: Sequence[int],
        frees: Sequence[int],
        declared: Mapping[str, Any],
        weights_bytes: int | None = None,
        kv_token_bytes: float | None = None,
    ) -> EngineShare:
        from sie_worker.sizing.memory_needs import EngineShare, cuda_cap

        return EngineShare(cuda_cap(need, totals[0]) if on_cuda else None)

    def packed_share(
        self, total: int, free: int, fraction: float | None, reserved: int
    ) -> float | None:
        from sie_worker.sizing.memory_needs import cuda_cap

        return cuda_cap(reserved, total)

    def checks(
        self,
        adapter: type[Adapter],
        served: ServedModel,
        loadtime: Mapping[str, Any],
        release: Release | None,
        *,
        on_cpu: bool,
        claim_width: int,
        extras: Mapping[str, Any],
    ) -> EngineChecks | None:
        from sie_worker.engines.default.checks import DefaultChecks

        return DefaultChecks(adapter, served, extras)

    def default_adapter(self, tasks: Mapping[str, Any]) -> str:
        return TRANSFORMERS

    def embedding_body(self) -> Literal["texts", "shaped"]:
        return "texts"


DEFAULT = DefaultFamily(
    kind="transformers",
    label="the default engine",
    module="sie_worker.engines.transformers",
    command_variable=None,
    bundles=("default",),
    exports_metrics=False,
    lora_as_model=False,
    rank_processes=None,
    checks_heads=False,
    adapters=(TRANSFORMERS, *SIE_TRANSFORMERS_ADAPTERS),
    own_adapters=(TRANSFORMERS,),
    memory_flag="--cuda-memory-fraction",
)
