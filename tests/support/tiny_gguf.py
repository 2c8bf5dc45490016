"""Write a tiny random-weight GGUF model for the real llama.cpp tests, so no test needs a hub.

``write_tiny_gguf(dst)`` writes ``dst/tiny-llama.gguf`` (about 0.5 MB, well under a second):
a Llama-architecture model, F32 everywhere, whose tokenizer is a byte-level BPE trained here
on a fixed text and stored as llama.cpp's ``gpt2`` tokenizer (every one of the 256 bytes a
token, so any text encodes), with ChatML's special tokens and chat template. Weights come from
a fixed seed, so the file is the same bytes every run. Its shape (4 heads over 2 key/value
heads, 2 layers) lets ``-ngl`` split the layers between llama-server and an RPC server.

The model is ``convert_hf_to_gguf.py``-free (that script needs torch): ``gguf`` (PyPI, the
release llama.cpp ships in gguf-py) writes the file; ``tokenizers`` trains the vocabulary.

Usage: ``python tests/support/tiny_gguf.py DIR`` prints the file's path.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CHATML_TEMPLATE",
    "TINY_GGUF",
    "TINY_GGUF_FILE",
    "TinyGguf",
    "write_tiny_gguf",
]

TINY_GGUF_FILE = "tiny-llama.gguf"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyGguf:
    """The model's shape, as the file's metadata states it."""

    name: str = "tiny-llama"
    context_length: int = 512
    embedding_length: int = 64
    block_count: int = 2
    feed_forward_length: int = 128
    head_count: int = 4
    head_count_kv: int = 2
    rms_epsilon: float = 1e-5
    # ChatML's three special tokens follow the trained vocabulary: <|endoftext|> is BOS,
    # <|im_end|> EOS (llama.cpp also stops on either as an end-of-generation token).
    special_tokens: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    trained_vocab_size: int = 384  # 256 bytes + merges

    @property
    def head_dim(self) -> int:
        return self.embedding_length // self.head_count

    @property
    def vocab_size(self) -> int:
        return self.trained_vocab_size + len(self.special_tokens)


TINY_GGUF = TinyGguf()

# A fixed training text: the vocabulary (and so the file) is the same every run.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A worker places each model on a contiguous block of devices and evicts idle ones.",
    "llama.cpp splits layers between devices; an RPC server lends another machine's device.",
    "Hello, how are you today? I am fine, thank you, and you?",
    "One two three four five six seven eight nine ten eleven twelve.",
    "The engine streams tokens as server-sent events and ends with a done marker.",
] * 4


def write_tiny_gguf(dst: Path, *, seed: int = 0, shape: TinyGguf = TINY_GGUF) -> Path:
    """Write the tiny model to ``dst/tiny-llama.gguf`` (``dst`` is created) and return its
    path."""
    import gguf
    import numpy as np

    dst.mkdir(parents=True, exist_ok=True)
    path = dst / TINY_GGUF_FILE
    tokens, merges = _train_vocabulary(shape)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(shape.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.embedding_length)
    writer.add_block_count(shape.block_count)
    writer.add_feed_forward_length(shape.feed_forward_length)
    writer.add_head_count(shape.head_count)
    writer.add_head_count_kv(shape.head_count_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(shape.rms_epsilon)
    writer.add_vocab_size(len(tokens))

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    special = set(shape.special_tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    rng = np.random.default_rng(seed)

    def weight(*rows_cols: int) -> np.ndarray:
        # numpy's (rows, cols) is ggml's {cols, rows}: llama.cpp's {n_in, n_out} layout
        return (rng.standard_normal(rows_cols) * 0.02).astype(np.float32)

    def ones(size: int) -> np.ndarray:
        return np.ones(size, dtype=np.float32)

    embd, ff, kv = shape.embedding_length, shape.feed_forward_length, shape.head_count_kv
    kv_width = kv * shape.head_dim
    writer.add_tensor("token_embd.weight", weight(len(tokens), embd))
    for block in range(shape.block_count):
        prefix = f"blk.{block}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones(embd))
        writer.add_tensor(f"{prefix}.attn_q.weight", weight(embd, embd))
        writer.add_tensor(f"{prefix}.attn_k.weight", weight(kv_width, embd))
        writer.add_tensor(f"{prefix}.attn_v.weight", weight(kv_width, embd))
        writer.add_tensor(f"{prefix}.attn_output.weight", weight(embd, embd))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", ones(embd))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weight(ff, embd))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weight(ff, embd))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(embd, ff))
    writer.add_tensor("output_norm.weight", ones(embd))
    writer.add_tensor("output.weight", weight(len(tokens), embd))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _train_vocabulary(shape: TinyGguf) -> tuple[list[str], list[str]]:
    """A byte-level BPE trained on the fixed corpus: its tokens in id order (GPT-2's byte
    alphabet first, so every byte is a token; the special tokens last) and its merges as
    ``"left right"`` strings, as llama.cpp's ``gpt2`` tokenizer reads them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=shape.trained_vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS, trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise RuntimeError("the trained vocabulary's ids are not 0..n-1")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return [*tokens, *shape.special_tokens], merges


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/support/tiny_gguf.py DIR")
    print(write_tiny_gguf(Path(sys.argv[1])))
