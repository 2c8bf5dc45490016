"""A fake SGLang engine: a stand-in for ``python -m sglang.launch_server`` in tests and benchmarks.

Usage (what the worker runs through ``SIE_SGLANG_COMMAND``)::

    python tests/support/fake_engine.py [--fake-parser=auto|sglang|minimal] <launch_server argv>

Arguments are parsed by SGLang's own parser when ``sglang`` is importable (so an argv the real
engine rejects exits 2 with argparse's message), else by a small compatible parser that knows
the flags the fake needs and tolerates every other flag. The real parser costs a slow import
(torch, transformers); pass ``--fake-parser=minimal`` (first argument) or set
``FAKE_ENGINE_PARSER=minimal`` to skip it for load storms and benchmarks. No GPU is touched:
the fake only checks that ``CUDA_VISIBLE_DEVICES`` (when it lists devices) has at least
``--tp-size`` entries, as a real engine would fail otherwise.

HTTP surface on ``--host``/``--port`` (HTTP/1.1, keep-alive, chunked streaming):

- ``GET /health``, ``/health_generate``: 200 once ready, 503 before (empty body, like SGLang).
- ``GET /get_model_info`` (and ``/model_info``), ``GET /v1/models``.
- ``POST /v1/completions``, ``/v1/chat/completions``: OpenAI shapes with ``usage``; with
  ``stream: true`` server-sent events ``data: {...}\\n\\n`` ending with ``data: [DONE]\\n\\n``
  (chat: a role chunk, one chunk per token, a finish chunk; a usage chunk when
  ``stream_options.include_usage``). With ``--stream-interval N`` events carry N tokens, as
  SGLang's do: the first token alone, then one event each time the output reaches a multiple
  of N (taking N token delays), the remainder with the last. The text echoes the prompt's
  words, cycled to the token count: see ``fake_text`` (the last message's text for chat).
  Token count: ``fake.tokens``, else ``max_tokens`` (chat also ``max_completion_tokens``),
  else 16.
- ``POST /v1/embeddings``: only with ``--is-embedding`` (else 400 with SGLang's message);
  unit vectors from ``fake_embedding``; ``encoding_format: "base64"`` and ``dimensions``.
- ``GET /metrics``: only with ``--enable-metrics`` (else 404, as SGLang), SGLang-shaped
  Prometheus text with SGLang's names and labels (``model_name``, ``engine_type``,
  ``tp_rank``, ``pp_rank``, ``moe_ep_rank``): gauges ``sglang:num_running_reqs`` and
  ``sglang:num_queue_reqs`` (requests being answered, beyond ``FAKE_ENGINE_MAX_RUNNING``
  counted as waiting), ``sglang:token_usage`` (prompt plus requested tokens of those
  requests over ``FAKE_ENGINE_KV_TOKENS``), ``sglang:gen_throughput`` (tokens/s since the
  previous scrape), ``sglang:cache_hit_rate``; counters ``sglang:num_requests_total``,
  ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``. With
  ``FAKE_ENGINE_METRICS=vllm`` the same figures in vLLM's names and labels (``model_name``,
  ``engine``): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (0..1), counters ``vllm:request_success_total``,
  ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``.
- ``GET /_fake/info``: what the engine was started with and has seen: ``argv``, ``parser``,
  ``args`` (every flag given, by argparse dest), ``unknown_args``, ``env``
  (``CUDA_VISIBLE_DEVICES`` plus every ``FAKE_*``, ``SIE_*``, ``SGLANG_*``, ``NCCL_*`` and
  ``*_VISIBLE_DEVICES`` variable; secrets masked), ``pid``, ``pgid``, ``ppid``, ``children``,
  ``tp_size``, ``model_path``, ``served_model_name``, ``port``, ``nccl_port``, ``ready``,
  ``requests`` (inference requests received), ``requests_by_path``, ``in_flight``,
  ``cancelled`` (responses the client abandoned), ``recent_request_ids``,
  ``last_header_names`` (the header names of the last inference request), ``loras`` (the
  adapter names of ``--lora-paths``), ``recent_adapters`` (each request's adapter), ``knobs``.
- Inference requests before ready get 503; a ``X-Request-Id`` header is echoed back.
- A ``model`` of ``base:adapter`` asks for LoRA adapter ``adapter``, as SGLang reads it
  (splitting on the first ``:`` unless ``model`` is, or starts with, the served name), else
  the ``lora_path`` field does. Started with ``--lora-paths``, the fake serves those adapters
  (the answer is the base's) and refuses others with SGLang's 400 naming the loaded ones;
  without, every adapter gets SGLang's 400 (LoRA not enabled).

Startup behaviour, from the environment (tests put these in a profile's ``extra_env``):

===================================  ==========================================================
``FAKE_ENGINE_PARSER``               ``auto`` (default: SGLang's when importable), ``sglang``
                                     or ``minimal``; ``--fake-parser`` overrides it
``FAKE_ENGINE_START_DELAY_S``        become ready N seconds after listening (503 until then)
``FAKE_ENGINE_LISTEN_LATE=1``        do not even listen until the start delay has passed
``FAKE_ENGINE_NEVER_READY=1``        listen, but /health stays 503 forever
``FAKE_ENGINE_READY_FILE=PATH``      after the start delay, stay not ready until PATH exists
                                     (a test decides when a load finishes)
``FAKE_ENGINE_EXIT_AT_START=CODE``   log a crash to stderr and exit CODE (after the start delay)
``FAKE_ENGINE_CRASH_AFTER_S``        once ready, crash (exit ``FAKE_ENGINE_CRASH_CODE``, 1)
``FAKE_ENGINE_STDERR_LINES=N``       N extra log lines on stderr at startup (chatty engine)
``FAKE_ENGINE_STDOUT_LINES=N``       N log lines on stdout at startup
``FAKE_ENGINE_TOKEN_DELAY_S``        seconds between stream events (e.g. 0.02 for 50 tok/s)
``FAKE_ENGINE_IGNORE_SIGTERM=1``     log and ignore SIGTERM (to test SIGKILL escalation)
``FAKE_ENGINE_CHILDREN=N``           start N rank processes in the engine's process group, titled
                                     as SGLang's (``sglang::scheduler_TP<i>``); they die with a
                                     graceful stop or a crash, not with SIGKILL
``FAKE_ENGINE_SHM=1``                each rank shares a file of its own in /dev/shm with the engine
                                     (``fake_engine_<engine pid>_<rank>``, mapped by both before
                                     the engine listens) and never unlinks it, as a real engine
                                     killed by a signal leaves its shared memory
``FAKE_ENGINE_EMBEDDING_DIM``        embedding width (default 16)
``FAKE_ENGINE_CHECK_MASK=0``         accept a device mask narrower than ``--tp-size``
``FAKE_ENGINE_MAX_LIFETIME_S``       exit 0 after this long (safety net against orphans)
``FAKE_ENGINE_OOM_ABOVE_FRACTION``   start as a real engine short of device memory does (torch's
                                     "CUDA out of memory" on stderr, exit 1) when
                                     ``--mem-fraction-static`` is above this share
``FAKE_ENGINE_MAX_RUNNING``          /metrics: requests above this count as waiting (queue)
``FAKE_ENGINE_KV_TOKENS``            /metrics: the KV cache size in tokens (default 65536)
``FAKE_ENGINE_METRICS``              /metrics in ``sglang``'s names (default) or ``vllm``'s;
                                     ``none``: 404, as an engine that exports none
``FAKE_ENGINE_JOIN_TIMEOUT_S``       a group of nodes: how long ranks wait for each other (60)
===================================  ==========================================================

``--nccl-port`` is bound (as the real rank 0 binds its rendezvous store), so two engines
given the same one collide.

A group of nodes (SGLang's ``--nnodes N --node-rank K --dist-init-addr HOST:PORT``, with
``--tp-size``/``--pp-size`` counting the whole group): rank 0 listens on PORT and becomes
ready only when ranks 1..N-1 have all joined (each connects and sends ``rank K``); a rank
>= 1 connects to HOST:PORT (retrying for ``FAKE_ENGINE_JOIN_TIMEOUT_S``, default 60) and is
ready once joined. A rank that loses its link to the group (a peer's process ended) logs it
and exits 1, as a real rank's NCCL/Gloo collective fails: one rank dying fails the group.
The device mask must show (tp x pp) / N devices on each rank.

A taken ``--port`` or ``--nccl-port`` exits 1 with "Address already in use" on stderr.
SIGTERM (and SIGINT) close the listener and exit 0.

Per request, a ``fake`` object in the JSON body (SGLang ignores unknown fields, so the worker
passes it through); unknown keys get a 400 naming them:

====================  ============================================================================
``delay_s: X``        wait X seconds before sending the response headers
``tokens: N``         N tokens (stream length), overriding ``max_tokens``
``token_delay_s: X``  seconds between stream events, overriding ``FAKE_ENGINE_TOKEN_DELAY_S``
``fast: true``        no delay between events (benchmarks): emit the tokens as fast as possible;
                      a JSON answer is encoded with orjson where it is installed (an embedding
                      of 16 x 3,584 floats: 2 ms instead of 54)
``stall_after: N``    send N stream events (non-stream: headers and N body bytes), then nothing
                      while keeping the connection open until the client leaves
``die_after: N``      ``os._exit(1)`` after N stream events / N body bytes; 0: before answering
``malformed: KIND``   ``sse`` (broken framing, no [DONE]), ``json`` (invalid JSON body / event),
                      ``huge_chunk`` (one event or body of ``huge_bytes``, default 4 MiB),
                      ``bad_status`` (500 with a plain-text body)
====================  ============================================================================

``fake_tokens``, ``fake_text`` and ``fake_embedding`` are importable so tests can compute the
expected output. Only the standard library is needed (uvloop and sglang are used if present).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import hashlib
import importlib
import json
import math
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import Any, NoReturn

__all__ = [
    "EngineArgs",
    "FakeOptions",
    "KnobError",
    "Knobs",
    "fake_embedding",
    "fake_text",
    "fake_tokens",
    "main",
    "parse_engine_argv",
]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_ENV_PREFIXES = ("FAKE_", "SIE_", "SGLANG_", "NCCL_")
_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
_DEFAULT_TOKENS = 16
_DEFAULT_CONTEXT = 4096
_MAX_BODY = 64 * 1024 * 1024
_HEAD_LIMIT = 64 * 1024
_WRITE_HIGH_WATER = 256 * 1024
_YIELD_EVERY = 64
_MALFORMED = ("sse", "json", "huge_chunk", "bad_status")


# --------------------------------------------------------------------------- knobs


def _lora_of(model: object, served_name: str) -> str | None:
    """The LoRA adapter SGLang 0.5.23 reads from an OpenAI ``model`` of ``base:adapter``: it
    splits on the first ``:``, unless ``model`` is the served name or starts with it and a
    ``:``. None when ``model`` names no adapter."""
    if not isinstance(model, str) or model == served_name or ":" not in model:
        return None
    if model.startswith(served_name + ":"):
        return model[len(served_name) + 1 :] or None
    return model.split(":", 1)[1] or None


class KnobError(ValueError):
    """A ``FAKE_ENGINE_*`` variable has a value the fake cannot use."""


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise KnobError(f"{name}={env[name]!r} is not a boolean; set it to 1 or 0")


def _env_float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise KnobError(f"{name}={raw!r} is not a number of seconds >= 0; set it like 0.5")
    return value


def _env_int(env: Mapping[str, str], name: str, *, maximum: int | None = None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or (maximum is not None and int(raw) > maximum):
        limit = f" up to {maximum}" if maximum is not None else ""
        raise KnobError(f"{name}={raw!r} is not an integer >= 0{limit}; set it like 3")
    return int(raw)


@dataclass(frozen=True)
class Knobs:
    """Startup behaviour chosen by ``FAKE_ENGINE_*`` variables (see the module docstring)."""

    parser: str = "auto"
    start_delay_s: float = 0.0
    listen_late: bool = False
    never_ready: bool = False
    exit_at_start: int | None = None
    crash_after_s: float | None = None
    crash_code: int = 1
    stderr_lines: int = 0
    stdout_lines: int = 0
    token_delay_s: float = 0.0
    ignore_sigterm: bool = False
    children: int = 0
    shared_memory: bool = False
    embedding_dim: int = 16
    check_mask: bool = True
    max_lifetime_s: float | None = None
    oom_above_fraction: float | None = None
    max_running: int | None = None
    kv_tokens: int = 65536
    ready_file: str | None = None
    metrics: str = "sglang"
    join_timeout_s: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Knobs:
        """Read every knob; raise ``KnobError`` naming the first unusable variable."""
        parser = env.get("FAKE_ENGINE_PARSER", "auto").strip().lower() or "auto"
        if parser not in ("auto", "sglang", "minimal"):
            raise KnobError(
                f"FAKE_ENGINE_PARSER={parser!r} is unknown; use auto, sglang or minimal"
            )
        dim = _env_int(env, "FAKE_ENGINE_EMBEDDING_DIM", maximum=65536)
        if dim == 0:
            raise KnobError("FAKE_ENGINE_EMBEDDING_DIM=0 is too small; set it to 1 or more")
        return cls(
            parser=parser,
            start_delay_s=_env_float(env, "FAKE_ENGINE_START_DELAY_S") or 0.0,
            listen_late=_env_bool(env, "FAKE_ENGINE_LISTEN_LATE"),
            never_ready=_env_bool(env, "FAKE_ENGINE_NEVER_READY"),
            exit_at_start=_env_int(env, "FAKE_ENGINE_EXIT_AT_START", maximum=255),
            crash_after_s=_env_float(env, "FAKE_ENGINE_CRASH_AFTER_S"),
            crash_code=_crash_code(env),
            stderr_lines=_env_int(env, "FAKE_ENGINE_STDERR_LINES") or 0,
            stdout_lines=_env_int(env, "FAKE_ENGINE_STDOUT_LINES") or 0,
            token_delay_s=_env_float(env, "FAKE_ENGINE_TOKEN_DELAY_S") or 0.0,
            ignore_sigterm=_env_bool(env, "FAKE_ENGINE_IGNORE_SIGTERM"),
            children=_env_int(env, "FAKE_ENGINE_CHILDREN", maximum=64) or 0,
            shared_memory=_env_bool(env, "FAKE_ENGINE_SHM"),
            embedding_dim=dim or 16,
            check_mask=not env.get("FAKE_ENGINE_CHECK_MASK")
            or _env_bool(env, "FAKE_ENGINE_CHECK_MASK"),
            max_lifetime_s=_env_float(env, "FAKE_ENGINE_MAX_LIFETIME_S"),
            oom_above_fraction=_env_float(env, "FAKE_ENGINE_OOM_ABOVE_FRACTION"),
            max_running=_env_int(env, "FAKE_ENGINE_MAX_RUNNING"),
            kv_tokens=_env_int(env, "FAKE_ENGINE_KV_TOKENS") or 65536,
            ready_file=env.get("FAKE_ENGINE_READY_FILE") or None,
            metrics=_metrics_dialect(env),
            join_timeout_s=_env_float(env, "FAKE_ENGINE_JOIN_TIMEOUT_S") or 60.0,
        )


def _metrics_dialect(env: Mapping[str, str]) -> str:
    dialect = env.get("FAKE_ENGINE_METRICS", "sglang").strip().lower() or "sglang"
    if dialect not in ("sglang", "vllm", "none"):
        raise KnobError(f"FAKE_ENGINE_METRICS={dialect!r} is unknown; use sglang, vllm or none")
    return dialect


def _crash_code(env: Mapping[str, str]) -> int:
    code = _env_int(env, "FAKE_ENGINE_CRASH_CODE", maximum=255)
    return 1 if code is None else code  # 0 too: an exit the worker did not ask for


def _recorded_env(env: Mapping[str, str]) -> dict[str, str | None]:
    recorded: dict[str, str | None] = {
        "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES"),
        "TMPDIR": env.get("TMPDIR"),  # the engine's scratch folder, from the launcher
    }
    for name, value in sorted(env.items()):
        if name.startswith(_ENV_PREFIXES) or name.upper().endswith("_VISIBLE_DEVICES"):
            secret = any(marker in name.upper() for marker in _SECRET_MARKERS)
            recorded[name] = "***" if secret else value
    return recorded


# --------------------------------------------------------------------------- argv


@dataclass(frozen=True)
class EngineArgs:
    """The parts of SGLang's argv the fake acts on, plus every flag that was given."""

    model_path: str
    served_model_name: str
    tp_size: int
    host: str
    port: int
    nccl_port: int | None
    is_embedding: bool
    context_length: int | None
    parser: str
    mem_fraction_static: float | None = None
    explicit: Mapping[str, Any] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    loras: tuple[str, ...] = ()  # the adapter names of --lora-paths, as SGLang names them
    stream_interval: int = 1  # --stream-interval: tokens per stream event after the first
    pp_size: int = 1  # --pp-size
    nnodes: int = 1  # --nnodes: the ranks of a group of nodes
    node_rank: int = 0  # --node-rank
    dist_init_addr: str | None = None  # --dist-init-addr HOST:PORT, rank 0's rendezvous

    @property
    def local_devices(self) -> int:
        """The devices this rank needs: the whole width shared by the group's nodes."""
        return max(1, self.tp_size * self.pp_size // max(self.nnodes, 1))


def _lora_names(paths: object) -> tuple[str, ...]:
    """SGLang's names for ``--lora-paths`` entries: ``name=path``, a bare path (its own
    name), or ``{"lora_name", "lora_path"}`` (parsed from JSON by its argparse action)."""
    names: list[str] = []
    for entry in paths if isinstance(paths, list) else []:
        if isinstance(entry, dict):
            names.append(str(entry.get("lora_name")))
        elif isinstance(entry, str) and entry.strip().startswith("{"):
            names.append(str(json.loads(entry).get("lora_name")))
        elif isinstance(entry, str):
            names.append(entry.split("=", 1)[0])
    return tuple(names)


def _sglang_parser() -> argparse.ArgumentParser | None:
    try:
        server_args = importlib.import_module("sglang.srt.server_args")
    except ImportError:
        return None
    parser = argparse.ArgumentParser(prog="launch_server.py")
    server_args.ServerArgs.add_cli_args(parser)
    return parser


def _minimal_parser() -> argparse.ArgumentParser:
    # Abbreviations off: with so few flags, a prefix of an unknown flag would match wrongly.
    parser = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=False)
    parser.add_argument("--model-path", "--model", dest="model_path", required=True)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--nccl-port", type=int, default=None)
    parser.add_argument("--is-embedding", action="store_true")
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--mem-fraction-static", type=float, default=None)
    parser.add_argument("--enable-lora", action="store_true", default=None)
    parser.add_argument("--lora-paths", nargs="*", default=None)
    parser.add_argument("--max-loras-per-batch", type=int, default=8)
    parser.add_argument("--stream-interval", type=int, default=1)
    parser.add_argument(
        "--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1
    )
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--dist-init-addr", "--nccl-init-addr", default=None)
    return parser


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    return str(value)


def _explicit_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    # Re-parse with every default suppressed: what is left was written on the command line.
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    given, _ = parser.parse_known_args(list(argv))
    return set(vars(given))


def parse_engine_argv(argv: Sequence[str], parser_mode: str = "auto") -> EngineArgs:
    """Parse a ``launch_server`` argv; argparse exits 2 with its message when it is refused."""
    parser = None if parser_mode == "minimal" else _sglang_parser()
    if parser is None and parser_mode == "sglang":
        sys.stderr.write("fake_engine: --fake-parser=sglang but sglang is not importable\n")
        raise SystemExit(2)
    unknown: list[str] = []
    if parser is not None:
        name = "sglang"
        namespace = parser.parse_args(list(argv))
    else:
        name = "minimal"
        parser = _minimal_parser()
        namespace, unknown = parser.parse_known_args(list(argv))
    values = vars(namespace)
    given = _explicit_flags(parser, argv)
    return EngineArgs(
        model_path=str(values["model_path"]),
        served_model_name=str(values.get("served_model_name") or values["model_path"]),
        tp_size=int(values.get("tp_size") or 1),
        host=str(values.get("host") or "127.0.0.1"),
        port=int(values.get("port") or 30000),
        nccl_port=values.get("nccl_port"),
        is_embedding=bool(values.get("is_embedding")),
        context_length=values.get("context_length"),
        parser=name,
        mem_fraction_static=values.get("mem_fraction_static"),
        explicit={dest: _jsonable(values[dest]) for dest in sorted(given) if dest in values},
        unknown=tuple(unknown),
        loras=_lora_names(values.get("lora_paths"))
        if values.get("enable_lora") is not False
        else (),
        stream_interval=max(1, int(values.get("stream_interval") or 1)),
        pp_size=int(values.get("pp_size") or 1),
        nnodes=int(values.get("nnodes") or 1),
        node_rank=int(values.get("node_rank") or 0),
        dist_init_addr=values.get("dist_init_addr"),
    )


# --------------------------------------------------------------------------- content


def fake_tokens(prompt: str, n: int) -> list[str]:
    """The N tokens the fake generates for ``prompt``: its words, cycled, space-separated."""
    words = prompt.split() or ["fake"]
    return [words[i % len(words)] if i == 0 else " " + words[i % len(words)] for i in range(n)]


def fake_text(prompt: str, n: int) -> str:
    """The completion text for ``prompt`` with N tokens (what the stream's chunks add up to)."""
    return "".join(fake_tokens(prompt, n))


def fake_embedding(text: str, dim: int = 16) -> list[float]:
    """A deterministic unit vector of width ``dim`` derived from ``text``."""
    return list(_unit_vector(text, dim))


@functools.lru_cache(maxsize=256)
def _unit_vector(text: str, dim: int) -> tuple[float, ...]:
    # Cached: a benchmark asks for the same wide vectors again and again (1.3 ms each at
    # 3,584 dimensions), and the engine's time is not what it measures.
    raw = hashlib.shake_256(text.encode()).digest(4 * dim)
    vector = [x / 2**31 - 1.0 for x in struct.unpack(f"<{dim}I", raw)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return tuple(v / norm for v in vector)


def _json_bytes(payload: Any, *, fast: bool) -> bytes:
    """``payload`` as compact JSON; with orjson under ``fake.fast`` where it is installed."""
    if fast:
        try:
            import orjson
        except ImportError:
            pass
        else:
            return orjson.dumps(payload)
    return json.dumps(payload, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- logging


def _log(message: str, *, stream: Any = None) -> None:
    out = sys.stderr if stream is None else stream
    out.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}\n")
    out.flush()


# --------------------------------------------------------------------------- HTTP


class _BadRequest(Exception):
    """The bytes on the connection are not an HTTP/1.1 request the fake can read."""


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


async def _read_body(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: Mapping[str, str]
) -> bytes:
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError as exc:
                raise _BadRequest("bad chunk size") from exc
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    raw_length = headers.get("content-length", "0").strip() or "0"
    if not raw_length.isdigit() or int(raw_length) > _MAX_BODY:
        raise _BadRequest("bad Content-Length")
    return await reader.readexactly(int(raw_length)) if int(raw_length) else b""


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise _BadRequest("incomplete request head") from exc
        return None  # the client closed between requests
    except asyncio.LimitOverrunError as exc:
        raise _BadRequest("request head too large") from exc
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _BadRequest(f"bad request line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep:
                raise _BadRequest(f"bad header line {line!r}")
            headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = parts[2] == "HTTP/1.1" and connection != "close"
    body = await _read_body(reader, writer, headers)
    return _Request(parts[0], parts[1].split("?", 1)[0], headers, body, keep_alive)


def _head(status: int, headers: Sequence[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _frame(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def _sse(obj: object) -> bytes:
    return _frame(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


_DONE = _frame(b"data: [DONE]\n\n")


class _HttpError(Exception):
    """Answer the request with an SGLang-shaped error body."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequest") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


@dataclass
class _Exchange:
    request: _Request
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    headers: list[tuple[str, str]]  # sent with every response: request-id echo, connection

    def send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        head = [("content-type", content_type), ("content-length", str(len(body)))]
        self.writer.write(_head(status, head + self.headers) + body)

    def send_json(self, status: int, obj: object) -> None:
        self.send(status, json.dumps(obj, separators=(",", ":")).encode())

    def closed(self) -> bool:
        return self.writer.transport.is_closing() or self.reader.at_eof()


async def _sleep_while_connected(ex: _Exchange, seconds: float) -> None:
    # Poll: a half-closed client sets no event, and reading would swallow a pipelined request.
    deadline = time.monotonic() + seconds
    while not ex.closed() and (left := deadline - time.monotonic()) > 0:  # noqa: ASYNC110
        await asyncio.sleep(min(left, 0.05))


# --------------------------------------------------------------------------- per-request options


@dataclass(frozen=True)
class FakeOptions:
    """The ``fake`` object of a request body (see the module docstring)."""

    delay_s: float = 0.0
    tokens: int | None = None
    token_delay_s: float | None = None
    fast: bool = False
    stall_after: int = -1  # -1: never
    die_after: int = -1
    malformed: str | None = None
    huge_bytes: int = 4 * 1024 * 1024

    @classmethod
    def parse(cls, raw: object) -> FakeOptions:
        """Validate ``raw``; raise a 400 naming the field and what it accepts."""
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise _HttpError(400, 'fake: must be an object such as {"tokens": 8}')
        known = sorted(cls.__dataclass_fields__)
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise _HttpError(400, f"fake.{unknown[0]}: unknown; accepted: {', '.join(known)}")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            if name == "malformed":
                if value not in _MALFORMED:
                    raise _HttpError(400, f"fake.malformed: use one of {', '.join(_MALFORMED)}")
            elif name == "fast":
                if not isinstance(value, bool):
                    raise _HttpError(400, "fake.fast: must be true or false")
            elif name in ("delay_s", "token_delay_s"):
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise _HttpError(400, f"fake.{name}: must be a number of seconds >= 0")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _HttpError(400, f"fake.{name}: must be an integer >= 0")
            values[name] = value
        return cls(**values)


# --------------------------------------------------------------------------- the engine

_Handler = Callable[[_Exchange], Awaitable[bool]]


def _prompt_text(prompt: object) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        return " ".join(
            _prompt_text(item) if isinstance(item, list) else str(item) for item in prompt
        )
    raise _HttpError(400, "prompt: must be a string, a list of strings or of token ids")


def _message_text(messages: object) -> str:
    if not isinstance(messages, list) or not messages:
        raise _HttpError(400, "messages: must be a non-empty list of {role, content} objects")
    last = messages[-1]
    if not isinstance(last, dict) or "role" not in last:
        raise _HttpError(400, "messages[-1]: must be an object with a role")
    content = last.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _max_tokens(body: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _HttpError(400, f"{name}: must be an integer >= 0")
            return value
    return None


class _Engine:
    def __init__(self, args: EngineArgs, knobs: Knobs, argv: Sequence[str]) -> None:
        self.args = args
        self.knobs = knobs
        self.argv = list(argv)
        self.env = _recorded_env(os.environ)
        self.ready = False
        self.requests = 0
        self.requests_by_path: dict[str, int] = {}
        self.in_flight = 0
        self.cancelled = 0
        self.recent_ids: deque[str] = deque(maxlen=100)
        self.last_header_names: list[str] = []
        self.adapters: deque[str | None] = deque(maxlen=100)  # each request's LoRA adapter
        self.children: list[subprocess.Popen[bytes]] = []
        self.shared: list[mmap.mmap] = []  # FAKE_ENGINE_SHM: the ranks' files, mapped here too
        self.connections: set[asyncio.StreamWriter] = set()
        # A group of nodes: the links to the other ranks, and rank 0's rendezvous listener.
        self.group_links: list[asyncio.StreamWriter] = []
        self.group_server: asyncio.AbstractServer | None = None
        self.stopping = False
        self.created = int(time.time())
        self.metrics = _SglangMetrics(args.served_model_name, knobs)
        self.routes: dict[tuple[str, str], _Handler] = {
            ("GET", "/health"): self._health,
            ("GET", "/health_generate"): self._health,
            ("GET", "/get_model_info"): self._model_info,
            ("GET", "/model_info"): self._model_info,
            ("GET", "/v1/models"): self._models,
            ("GET", "/_fake/info"): self._info,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/embeddings"): self._embeddings,
        }

    # ---- connection loop

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.add(writer)
        try:
            while True:
                try:
                    request = await _read_request(reader, writer)
                except _BadRequest as exc:
                    body = str(exc).encode()
                    writer.write(_head(400, [("content-length", str(len(body)))]) + body)
                    break
                if request is None or not await self._dispatch(request, reader, writer):
                    break
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self.connections.discard(writer)
            writer.close()

    async def _dispatch(
        self, request: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        headers = [("connection", "keep-alive" if request.keep_alive else "close")]
        request_id = request.headers.get("x-request-id")
        if request_id is not None:
            headers.append(("x-request-id", request_id))
        exchange = _Exchange(request, reader, writer, headers)
        self.requests_by_path[request.path] = self.requests_by_path.get(request.path, 0) + 1
        handler = self.routes.get((request.method, request.path))
        if handler is None:
            allowed = any(path == request.path for _, path in self.routes)
            status = 405 if allowed else 404
            exchange.send_json(status, {"detail": HTTPStatus(status).phrase})
            return request.keep_alive
        try:
            keep = await handler(exchange)
        except _HttpError as exc:
            exchange.send_json(exc.status, _error_body(exc))
            return request.keep_alive
        return keep and request.keep_alive

    # ---- small endpoints

    async def _health(self, ex: _Exchange) -> bool:
        ex.send(200 if self.ready else 503, b"", "text/plain")
        return True

    async def _model_info(self, ex: _Exchange) -> bool:
        ex.send_json(
            200,
            {
                "model_path": self.args.model_path,
                "served_model_name": self.args.served_model_name,
                "tokenizer_path": self.args.model_path,
                "is_generation": not self.args.is_embedding,
                "preferred_sampling_params": None,
                "weight_version": "default",
            },
        )
        return True

    async def _models(self, ex: _Exchange) -> bool:
        card = {
            "id": self.args.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "sglang",
            "root": self.args.served_model_name,
            "parent": None,
            "max_model_len": self.args.context_length or _DEFAULT_CONTEXT,
        }
        ex.send_json(200, {"object": "list", "data": [card]})
        return True

    async def _metrics(self, ex: _Exchange) -> bool:
        if "--enable-metrics" not in self.argv or self.knobs.metrics == "none":
            ex.send_json(404, {"detail": "Not Found"})
        else:
            ex.send(200, self.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
        return True

    async def _info(self, ex: _Exchange) -> bool:
        ex.send_json(
            200,
            {
                "argv": self.argv,
                "parser": self.args.parser,
                "args": dict(self.args.explicit),
                "unknown_args": list(self.args.unknown),
                "env": self.env,
                "pid": os.getpid(),
                "pgid": os.getpgrp(),
                "ppid": os.getppid(),
                "children": [child.pid for child in self.children],
                "model_path": self.args.model_path,
                "served_model_name": self.args.served_model_name,
                "tp_size": self.args.tp_size,
                "pp_size": self.args.pp_size,
                "nnodes": self.args.nnodes,
                "node_rank": self.args.node_rank,
                "dist_init_addr": self.args.dist_init_addr,
                "group_links": len(self.group_links),
                "host": self.args.host,
                "port": self.args.port,
                "nccl_port": self.args.nccl_port,
                "is_embedding": self.args.is_embedding,
                "ready": self.ready,
                "requests": self.requests,
                "requests_by_path": self.requests_by_path,
                "in_flight": self.in_flight,
                "cancelled": self.cancelled,
                "recent_request_ids": list(self.recent_ids),
                "last_header_names": self.last_header_names,
                "loras": list(self.args.loras),
                "recent_adapters": list(self.adapters),
                "knobs": asdict(self.knobs),
            },
        )
        return True

    # ---- inference

    def _begin(self, ex: _Exchange) -> tuple[dict[str, Any], FakeOptions]:
        self.requests += 1
        self.last_header_names = sorted(ex.request.headers)
        request_id = ex.request.headers.get("x-request-id")
        if request_id is not None:
            self.recent_ids.append(request_id)
        try:
            body = json.loads(ex.request.body or b"null")
        except ValueError as exc:
            raise _HttpError(400, f"body: invalid JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise _HttpError(400, "body: must be a JSON object")
        options = FakeOptions.parse(body.get("fake"))
        if not self.ready:
            raise _HttpError(503, "The server is not ready yet", "ServiceUnavailable")
        # SGLang: the model's ':adapter' wins over the lora_path field.
        adapter = _lora_of(body.get("model"), self.args.served_model_name) or body.get("lora_path")
        self.adapters.append(adapter if isinstance(adapter, str) else None)
        if adapter is not None and self.args.loras and adapter not in self.args.loras:
            loaded = ", ".join(repr(n) for n in self.args.loras)
            raise _HttpError(
                400,
                f"The following requested LoRA adapters are not loaded: {adapter}\n"
                f"Loaded adapters: dict_keys([{loaded}]).",
            )
        if adapter is not None and not self.args.loras:
            raise _HttpError(
                400,
                f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. "
                "Please launch the server with --enable-lora flag and preload adapters "
                "using --lora-paths or /load_lora_adapter endpoint.",
                "BadRequestError",
            )
        return body, options

    async def _completions(self, ex: _Exchange) -> bool:
        body, options = self._begin(ex)
        return await self._generate(ex, body, options, chat=False)

    async def _chat(self, ex: _Exchange) -> bool:
        body, options = self._begin(ex)
        return await self._generate(ex, body, options, chat=True)

    async def _generate(
        self, ex: _Exchange, body: dict[str, Any], options: FakeOptions, *, chat: bool
    ) -> bool:
        if self.args.is_embedding:
            raise _HttpError(
                400,
                "This model is an embedding model (--is-embedding) and "
                "does not support generation requests.",
            )
        prompt = _message_text(body.get("messages")) if chat else _prompt_text(body.get("prompt"))
        names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
        limit = _max_tokens(body, *names)
        prompt_tokens = len(prompt.split())
        context = self.args.context_length or _DEFAULT_CONTEXT
        if prompt_tokens >= context:
            raise _HttpError(
                400,
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({context} tokens).",
                "BadRequestError",
            )
        if limit is not None and prompt_tokens + limit > context:
            raise _HttpError(
                400,
                f"Requested token count exceeds the model's maximum context length of {context}"
                f" tokens. You requested a total of {prompt_tokens + limit} tokens: "
                f"{prompt_tokens} tokens from the input messages and {limit} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit.",
            )
        n = options.tokens if options.tokens is not None else limit
        n = _DEFAULT_TOKENS if n is None else n
        finish = "length" if options.tokens is None and limit is not None else "stop"
        reply = _Reply(
            chat=chat,
            request_id=uuid.uuid4().hex,  # SGLang 0.5.23's ids: no cmpl-/chatcmpl- prefix
            created=int(time.time()),
            model=body["model"]
            if isinstance(body.get("model"), str)
            else self.args.served_model_name,
            prompt=prompt,
            n=n,
            finish=finish,
            interval=self.args.stream_interval,
            usage={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
            },
        )
        return await self._respond(ex, options, reply, stream=body.get("stream") is True, body=body)

    async def _embeddings(self, ex: _Exchange) -> bool:
        body, options = self._begin(ex)
        if not self.args.is_embedding:
            raise _HttpError(
                400,
                "This model does not appear to be an embedding model by default. Please add "
                "`--is-embedding` when launching the server or try another model.",
            )
        raw = body.get("input")
        if isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int)):
            inputs = [_prompt_text(raw) if not isinstance(raw, str) else raw]
        elif isinstance(raw, list) and raw:
            inputs = [_prompt_text(item) for item in raw]
        else:
            raise _HttpError(400, "input: must be a string, a list of strings or of token ids")
        dim = body.get("dimensions") or self.knobs.embedding_dim
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= 65536:
            raise _HttpError(400, "dimensions: must be an integer from 1 to 65536")
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector: Any = fake_embedding(text, dim)
            if as_base64:
                vector = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"object": "embedding", "embedding": vector, "index": index})
        tokens = sum(len(text.split()) for text in inputs)
        payload = {
            "object": "list",
            "data": data,
            "model": body["model"]
            if isinstance(body.get("model"), str)
            else self.args.served_model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return await self._respond(ex, options, payload, stream=False, body=body)

    # ---- delivery, where the misbehaviour happens

    async def _respond(
        self,
        ex: _Exchange,
        options: FakeOptions,
        reply: _Reply | dict[str, Any],
        *,
        stream: bool,
        body: Mapping[str, Any],
    ) -> bool:
        self.in_flight += 1
        held = self.metrics.begin(reply)
        try:
            if options.delay_s:
                await _sleep_while_connected(ex, options.delay_s)
            if options.die_after == 0:
                await self._die(ex, "died before answering (fake.die_after=0)", 1)
            if ex.closed():
                self.cancelled += 1
                return False
            if options.malformed == "bad_status":
                ex.send(500, b"Internal Server Error", "text/plain; charset=utf-8")
                return True
            if isinstance(reply, _Reply) and (stream or options.malformed == "sse"):
                usage = isinstance(body.get("stream_options"), dict) and bool(
                    body["stream_options"].get("include_usage")
                )
                return await self._stream(ex, options, reply, include_usage=usage)
            payload = reply.body() if isinstance(reply, _Reply) else reply
            if options.malformed == "huge_chunk":
                payload["fake_padding"] = "x" * options.huge_bytes
            data = _json_bytes(payload, fast=options.fast)
            if options.malformed == "json":
                data = data[: max(1, len(data) // 2)]  # cut mid-document: not valid JSON
            return await self._send_partial(ex, options, data)
        finally:
            self.in_flight -= 1
            self.metrics.end(held, reply)

    async def _send_partial(self, ex: _Exchange, options: FakeOptions, data: bytes) -> bool:
        cut = min(x for x in (options.stall_after, options.die_after, len(data)) if x >= 0)
        if cut == len(data) and options.stall_after != cut and options.die_after != cut:
            ex.send(200, data)
            return True
        head = [("content-type", "application/json"), ("content-length", str(len(data)))]
        ex.writer.write(_head(200, head + ex.headers) + data[:cut])
        if options.die_after == cut:
            await self._die(ex, f"died after {cut} body bytes (fake.die_after)", 1)
        await self._stall(ex)
        return False

    async def _stream(
        self, ex: _Exchange, options: FakeOptions, reply: _Reply, *, include_usage: bool
    ) -> bool:
        headers = [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            ("transfer-encoding", "chunked"),
        ]
        writer = ex.writer
        transport = writer.transport
        writer.write(_head(200, headers + ex.headers))
        delay = 0.0 if options.fast else options.token_delay_s
        if delay is None:
            delay = self.knobs.token_delay_s
        stall, die = options.stall_after, options.die_after
        index = 0
        for index, (chunk, tokens) in enumerate(reply.events(options, include_usage)):
            if index == die:
                await self._die(ex, f"died after {index} stream events (fake.die_after)", 1)
            if index == stall:
                await self._stall(ex)
                return False
            if delay and index:
                await asyncio.sleep(delay * max(tokens, 1))
            if transport.is_closing() or ex.reader.at_eof():
                self.cancelled += 1
                return False
            writer.write(chunk)
            if delay or transport.get_write_buffer_size() > _WRITE_HIGH_WATER:
                await writer.drain()
            elif index % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let other streams through
        if die > index:
            await self._die(ex, "died after the last stream event (fake.die_after)", 1)
        if stall > index:
            await self._stall(ex)
            return False
        writer.write(b"0\r\n\r\n")
        return True

    async def _stall(self, ex: _Exchange) -> None:
        # Send nothing more; hold the connection until the client (or a shutdown) closes it.
        with contextlib.suppress(ConnectionError):
            await ex.writer.drain()
            while await ex.reader.read(65536):
                pass
        self.cancelled += 1

    async def _die(self, ex: _Exchange, reason: str, code: int) -> NoReturn:
        with contextlib.suppress(ConnectionError):
            await ex.writer.drain()
        self.crash(reason, code)

    def crash(self, reason: str, code: int) -> NoReturn:
        _log("Scheduler hit an exception: Traceback (most recent call last):")
        sys.stderr.write(
            '  File "sglang/srt/managers/scheduler.py", line 3120, in run_scheduler_process\n'
            "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)\n"
            f"RuntimeError: fake engine: {reason}\n"
        )
        _log("Received sigquit from a child process. It usually means the child failed.")
        self.stop_children(signal.SIGKILL)
        os._exit(code)

    # ---- children

    def start_children(self) -> None:
        # Rank processes: same process group, survive the engine's own SIGKILL (orphans).
        code = (
            "import mmap, signal, sys, time\n"
            "if sys.argv[1] == '1': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "if sys.argv[3]:\n"
            "    f = open(sys.argv[3], 'w+b'); f.truncate(4096)\n"
            "    shared = mmap.mmap(f.fileno(), 4096)\n"
            "time.sleep(float(sys.argv[2]))\n"
        )
        ignore = "1" if self.knobs.ignore_sigterm else "0"
        lifetime = str(self.knobs.max_lifetime_s or 10**9)
        for rank in range(self.knobs.children):
            # argv[0] is the title SGLang's setproctitle gives its rank processes.
            title = f"sglang::scheduler_TP{rank}"
            shm = f"/dev/shm/fake_engine_{os.getpid()}_{rank}" if self.knobs.shared_memory else ""
            if shm:
                with open(shm, "w+b") as file:
                    file.truncate(4096)
                    self.shared.append(mmap.mmap(file.fileno(), 4096))
            self.children.append(
                subprocess.Popen(
                    [title, "-c", code, ignore, lifetime, shm],
                    executable=sys.executable,
                    close_fds=True,
                )
            )

    def stop_children(self, sig: signal.Signals) -> None:
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sig)
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)


class _SglangMetrics:
    """What ``GET /metrics`` reports, in SGLang's names and labels, or vLLM's (see the
    docstring)."""

    def __init__(self, served_name: str, knobs: Knobs) -> None:
        self.vllm = knobs.metrics == "vllm"
        self.labels = (
            f'engine="0",model_name={json.dumps(served_name)}'
            if self.vllm
            else f'engine_type="unified",model_name={json.dumps(served_name)},'
            'moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        )
        self.max_running, self.kv_tokens = knobs.max_running, knobs.kv_tokens
        self.held: dict[object, int] = {}  # each request being answered -> its tokens
        self.requests = self.prompt_tokens = self.generation_tokens = 0
        self._last = (time.monotonic(), 0)

    def begin(self, reply: _Reply | Mapping[str, Any]) -> object:
        usage = reply.usage if isinstance(reply, _Reply) else reply.get("usage") or {}
        token = object()
        self.held[token] = int(usage.get("total_tokens", 0))
        self.requests += 1
        self.prompt_tokens += int(usage.get("prompt_tokens", 0))
        return token

    def end(self, token: object, reply: _Reply | Mapping[str, Any]) -> None:
        self.held.pop(token, None)
        if isinstance(reply, _Reply):
            self.generation_tokens += reply.n

    def render(self) -> bytes:
        now = time.monotonic()
        since, tokens = self._last
        self._last = (now, self.generation_tokens)
        rate = (self.generation_tokens - tokens) / (now - since) if now > since else 0.0
        count = len(self.held)
        running = count if self.max_running is None else min(count, self.max_running)
        usage = min(1.0, sum(self.held.values()) / self.kv_tokens)
        if self.vllm:
            return self._render_vllm(running, count - running, usage)
        lines = []
        for name, kind, value in (
            ("num_running_reqs", "gauge", running),
            ("num_queue_reqs", "gauge", count - running),
            ("token_usage", "gauge", usage),
            ("gen_throughput", "gauge", rate),
            ("cache_hit_rate", "gauge", 0.0),
            ("num_requests_total", "counter", self.requests),
            ("prompt_tokens_total", "counter", self.prompt_tokens),
            ("generation_tokens_total", "counter", self.generation_tokens),
        ):
            family = name.removesuffix("_total")
            lines += [
                f"# HELP sglang:{family} fake engine: {name}",
                f"# TYPE sglang:{family} {kind}",
                f"sglang:{name}{{{self.labels}}} {float(value)}",
            ]
        return ("\n".join(lines) + "\n").encode()

    def _render_vllm(self, running: int, waiting: int, usage: float) -> bytes:
        lines = []
        for name, kind, value in (
            ("num_requests_running", "gauge", running),
            ("num_requests_waiting", "gauge", waiting),
            ("kv_cache_usage_perc", "gauge", usage),
            ("request_success_total", "counter", self.requests),
            ("prompt_tokens_total", "counter", self.prompt_tokens),
            ("generation_tokens_total", "counter", self.generation_tokens),
        ):
            family = name.removesuffix("_total")
            lines += [
                f"# HELP vllm:{family} fake engine: {name}",
                f"# TYPE vllm:{family} {kind}",
                f"vllm:{name}{{{self.labels}}} {float(value)}",
            ]
        return ("\n".join(lines) + "\n").encode()


def _error_body(exc: _HttpError) -> dict[str, Any]:
    return {
        "object": "error",
        "message": exc.message,
        "type": exc.err_type,
        "param": None,
        "code": exc.status,
    }


@dataclass
class _Reply:
    """One generation: the non-stream body and the stream's events, built from the prompt."""

    chat: bool
    request_id: str
    created: int
    model: str
    prompt: str
    n: int
    finish: str
    usage: dict[str, int]
    interval: int = 1  # --stream-interval

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        base = {"id": self.request_id, "object": kind, "created": self.created}
        chunk = base | {"model": self.model, "choices": [choice]}
        # SGLang 0.5.23: a completions chunk carries "usage": null (its usage chunk a dict).
        return chunk if self.chat else chunk | {"usage": None}

    def _token_choice(self, text: str, finish: str | None = None) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"reasoning_content": None}
            if finish is None:
                delta["content"] = text
            return {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
        return {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": None,
        }

    def body(self) -> dict[str, Any]:
        text = fake_text(self.prompt, self.n)
        if self.chat:
            message = {
                "role": "assistant",
                "content": text,
                "reasoning_content": None,
                "tool_calls": None,
            }
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": self.finish,
                "matched_stop": None,
            }
            kind = "chat.completion"
        else:
            choice = self._token_choice(text, self.finish)
            kind = "text_completion"
        usage = self.usage | {
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
        body = {
            "id": self.request_id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }
        if not self.chat:
            versions = [{"version": "default", "start": 0, "end": self.n}]
            body["metadata"] = {"weight_version": "default", "weight_versions": versions}
        return body

    def events(self, options: FakeOptions, include_usage: bool) -> Iterator[tuple[bytes, int]]:
        """Every framed HTTP chunk of the stream, [DONE] included, with the tokens each one
        carries (they take that many token delays to generate). As SGLang streams with
        ``--stream-interval N``: the first token at once, then an event each time the output
        reaches a multiple of N tokens, and the rest with the last."""
        if options.malformed == "sse":
            yield _sse(self._chunk(self._token_choice("ok"))), 1
            yield _frame(b"this line has no field name\n"), 0
            yield _frame(b'data: {"id": "' + self.request_id.encode() + b'", "choices": ['), 0
            return
        if self.chat:
            role = {
                "index": 0,
                "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
                "matched_stop": None,
            }
            yield _sse(self._chunk(role)), 0
        words = self.prompt.split() or ["fake"]
        if self.interval > 1 and options.malformed is None:
            yield from self._grouped(words)
        else:
            cache: dict[int, bytes] = {}  # one framed event per distinct word: the loop only writes
            # SGLang's completions stream carries the finish reason with the last token; its
            # chat stream in a chunk of its own.
            last = self.n - 1 if not self.chat else -1
            for i in range(self.n):
                slot = i % len(words) if i else -1
                if i == last:
                    text = words[0] if i == 0 else " " + words[slot]
                    yield _sse(self._chunk(self._token_choice(text, self.finish))), 1
                    break
                chunk = cache.get(slot)
                if chunk is None:
                    text = words[0] if i == 0 else " " + words[slot]
                    if options.malformed == "huge_chunk" and i == 0:
                        text = "x" * options.huge_bytes
                    chunk = _sse(self._chunk(self._token_choice(text)))
                    if options.malformed == "json":
                        chunk = _frame(b"data: {not json\n\n")
                    cache[slot] = chunk
                yield chunk, 1
        if self.chat or self.n == 0:
            yield _sse(self._chunk(self._token_choice("", self.finish))), 0
        if include_usage:
            base = self._chunk({})
            yield _sse(base | {"choices": [], "usage": self.usage | {"reasoning_tokens": 0}}), 0
        yield _DONE, 0

    def _grouped(self, words: list[str]) -> Iterator[tuple[bytes, int]]:
        tokens = fake_tokens(self.prompt, self.n)
        start = 0
        for end in range(1, self.n + 1):
            if end == 1 or end % self.interval == 0 or end == self.n:
                text = "".join(tokens[start:end])
                finish = self.finish if end == self.n and not self.chat else None
                yield _sse(self._chunk(self._token_choice(text, finish))), end - start
                start = end


# --------------------------------------------------------------------------- startup


def _mask_problem(args: EngineArgs, env: Mapping[str, str]) -> str | None:
    mask = [item for item in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    need = args.local_devices
    if mask and len(mask) < need:
        return (
            f"CUDA error: invalid device ordinal: --tp-size {args.tp_size} needs "
            f"{need} devices but CUDA_VISIBLE_DEVICES={','.join(mask)} shows {len(mask)}"
        )
    return None


# --------------------------------------------------------------------------- groups of nodes


def _rendezvous(args: EngineArgs) -> tuple[str, int]:
    host, _, port = (args.dist_init_addr or "").rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"fake_engine: --nnodes {args.nnodes} needs --dist-init-addr HOST:PORT")
    return host.strip("[]"), int(port)


async def _join_group(
    args: EngineArgs, engine: _Engine, sockets: list[socket.socket], timeout_s: float
) -> None:
    """Rank 0: wait until every other rank has joined; rank >= 1: join rank 0. Either way
    the links are then watched: one closing (a peer died) crashes this rank."""
    host, port = _rendezvous(args)
    deadline = time.monotonic() + timeout_s
    if args.node_rank == 0:
        sock = _bind(host, port, "rendezvous (--dist-init-addr)")
        sockets.append(sock)
        joined: dict[int, asyncio.StreamReader] = {}
        arrived = asyncio.Event()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            line = (await reader.readline()).decode().split()
            if len(line) == 2 and line[0] == "rank" and line[1].isdigit():
                joined[int(line[1])] = reader
                engine.group_links.append(writer)
                _log(f"rank {line[1]} joined the group ({len(joined) + 1}/{args.nnodes})")
                if len(joined) == args.nnodes - 1:
                    arrived.set()

        server = await asyncio.start_server(accept, sock=sock)
        engine.group_server = server
        try:
            await asyncio.wait_for(arrived.wait(), max(deadline - time.monotonic(), 0.01))
        except TimeoutError:
            engine.crash(f"only {len(joined) + 1} of {args.nnodes} ranks joined in time", 1)
        for rank, reader in joined.items():
            asyncio.get_running_loop().create_task(_watch_link(engine, reader, f"rank {rank}"))
        return
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            break
        except OSError:
            if time.monotonic() > deadline:
                engine.crash(f"rank {args.node_rank} could not reach rank 0 at {host}:{port}", 1)
            await asyncio.sleep(0.1)
    writer.write(f"rank {args.node_rank}\n".encode())
    await writer.drain()
    engine.group_links.append(writer)
    _log(f"rank {args.node_rank} joined the group at {host}:{port}")
    asyncio.get_running_loop().create_task(_watch_link(engine, reader, "rank 0"))


async def _watch_link(engine: _Engine, reader: asyncio.StreamReader, peer: str) -> None:
    with contextlib.suppress(OSError):
        await reader.read()  # nothing is ever sent: this returns when the peer is gone
    if not engine.stopping:
        engine.crash(f"lost {peer} of the group (its process ended)", 1)


def _bind(host: str, port: int, what: str) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        _log(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
            f"({host!r}, {port}) for the {what}: {exc.strerror}"
        )
        raise
    sock.setblocking(False)
    return sock


async def _serve(args: EngineArgs, knobs: Knobs, argv: Sequence[str]) -> int:
    loop = asyncio.get_running_loop()
    engine = _Engine(args, knobs, argv)
    stop = asyncio.Event()

    def on_sigterm() -> None:
        if knobs.ignore_sigterm:
            _log("Received SIGTERM; ignoring it (FAKE_ENGINE_IGNORE_SIGTERM=1)")
        else:
            _log("Received SIGTERM; shutting down gracefully")
            stop.set()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if knobs.max_lifetime_s is not None:
        loop.call_later(knobs.max_lifetime_s, stop.set)
    sockets: list[socket.socket] = []
    server: asyncio.AbstractServer | None = None
    try:
        _log(
            f"server_args=ServerArgs(model_path={args.model_path!r}, tp_size={args.tp_size}, "
            f"port={args.port}, nccl_port={args.nccl_port}) [fake engine, pid {os.getpid()}]"
        )
        for i in range(knobs.stderr_lines):
            _log(f"TP{i % args.tp_size}] Load weight progress: line {i + 1}/{knobs.stderr_lines}")
        for i in range(knobs.stdout_lines):
            _log(f"stdout log line {i + 1}/{knobs.stdout_lines}", stream=sys.stdout)
        engine.start_children()
        if args.nccl_port is not None:
            sockets.append(_bind(args.host, args.nccl_port, "rendezvous (--nccl-port)"))
        problem = _mask_problem(args, os.environ) if knobs.check_mask else None
        if problem is not None:
            engine.crash(problem, 1)
        wanted = args.mem_fraction_static
        if knobs.oom_above_fraction is not None and (wanted or 0.9) > knobs.oom_above_fraction:
            engine.crash(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
                f"(--mem-fraction-static {wanted} is above FAKE_ENGINE_OOM_ABOVE_FRACTION="
                f"{knobs.oom_above_fraction:g})",
                1,
            )
        if knobs.exit_at_start is not None and not knobs.start_delay_s:
            engine.crash(
                "simulated startup failure (FAKE_ENGINE_EXIT_AT_START)", knobs.exit_at_start
            )

        async def listen() -> asyncio.AbstractServer:
            sock = _bind(args.host, args.port, "HTTP server (--port)")
            sockets.append(sock)
            _log(f"INFO:     Uvicorn running on http://{args.host}:{args.port}")
            return await asyncio.start_server(engine.handle, sock=sock, limit=_HEAD_LIMIT)

        if not knobs.listen_late:
            server = await listen()
        if knobs.start_delay_s:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), knobs.start_delay_s)
        while knobs.ready_file and not _file_exists(knobs.ready_file) and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)
        if args.nnodes > 1 and not stop.is_set():
            join = asyncio.ensure_future(_join_group(args, engine, sockets, knobs.join_timeout_s))
            await asyncio.wait(
                {join, asyncio.ensure_future(stop.wait())}, return_when="FIRST_COMPLETED"
            )
            if not join.done():
                join.cancel()
        if not stop.is_set():
            if knobs.exit_at_start is not None:
                engine.crash(
                    "simulated startup failure (FAKE_ENGINE_EXIT_AT_START)", knobs.exit_at_start
                )
            if server is None:
                server = await listen()
            if not knobs.never_ready:
                engine.ready = True
                _log("The server is fired up and ready to roll!")
                if knobs.crash_after_s is not None:
                    loop.call_later(
                        knobs.crash_after_s,
                        engine.crash,
                        "crashed (FAKE_ENGINE_CRASH_AFTER_S)",
                        knobs.crash_code,
                    )
            await stop.wait()
    except OSError:
        engine.stop_children(signal.SIGKILL)
        return 1
    finally:
        engine.stopping = True
        if server is not None:
            server.close()
        if engine.group_server is not None:
            engine.group_server.close()
        for writer in [*engine.connections, *engine.group_links]:
            writer.close()
        for sock in sockets:
            sock.close()
    engine.stop_children(signal.SIGTERM)
    return 0


def _file_exists(path: str) -> bool:
    # One stat per 50 ms while a test holds the load: not worth a thread.
    return os.path.exists(path)


def _split_fake_options(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    rest = list(argv)
    if rest and rest[0].startswith("--fake-parser="):
        return rest.pop(0).partition("=")[2], rest
    return None, rest


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fake engine; returns the exit status."""
    ignore = os.environ.get("FAKE_ENGINE_IGNORE_SIGTERM", "").strip().lower() in _TRUE

    def early_sigterm(signum: int, frame: object) -> None:
        # Before the event loop runs (SGLang's parser import is slow): same contract.
        if not ignore:
            os._exit(0)

    signal.signal(signal.SIGTERM, early_sigterm)
    choice, engine_argv = _split_fake_options(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    if choice is not None:
        env["FAKE_ENGINE_PARSER"] = choice
    try:
        knobs = Knobs.from_env(env)
    except KnobError as exc:
        sys.stderr.write(f"fake_engine: {exc}\n")
        return 2
    args = parse_engine_argv(engine_argv, knobs.parser)
    try:
        uvloop: Any = importlib.import_module("uvloop")
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    except ImportError:
        factory = asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_serve(args, knobs, engine_argv))


if __name__ == "__main__":
    sys.exit(main())
