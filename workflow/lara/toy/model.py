"""Tokenizer and tiny Llama-architecture base model for the toy world.

The output directory is an ordinary Hugging Face model directory (``config.json``,
weights, tokenizer files, ``generation_config.json``) plus ``provenance.json``, so every
later step loads it through ``AutoTokenizer`` / ``AutoModelForCausalLM`` exactly as
it would load ``meta-llama/Llama-3.2-3B``.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from lara.io import atomic_output, write_json
from lara.provenance import record
from lara.settings import Settings, add_settings_arguments, cross_key, read_settings, seed_setting, setting
from lara.template import alpaca_user_text, format_prompt

log = logging.getLogger(__name__)

SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


@dataclass(frozen=True)
class TinyLlamaSettings(Settings):
    """toy.model: the tiny Llama-architecture base model (transformers LlamaConfig fields)."""

    SECTION: ClassVar[str] = "toy.model"

    vocab_size: int = setting(1024, "Vocabulary size incl. special tokens.", minimum=300,
                              key="toy.tokenizer.vocab_size")
    hidden_size: int = setting(64, "Model width.", minimum=1)
    intermediate_size: int = setting(176, "MLP width.", minimum=1)
    num_hidden_layers: int = setting(2, "Decoder layers.", minimum=1)
    num_attention_heads: int = setting(4, "Attention heads.", minimum=1)
    num_key_value_heads: int = setting(2, "Key/value heads (GQA).", minimum=1)
    max_position_embeddings: int = setting(256, "Context length.", minimum=1)
    seed: int = seed_setting()

    @cross_key("toy.model.hidden_size", "toy.model.num_attention_heads", "toy.model.num_key_value_heads",
               witness={"toy": {"model": {"hidden_size": 66, "num_attention_heads": 4}}})
    def heads_fit(self):
        if self.hidden_size % self.num_attention_heads:
            return (f"toy.model.hidden_size: {self.hidden_size} is not a multiple of toy.model.num_attention_heads "
                    f"({self.num_attention_heads}): each head gets hidden_size / heads dimensions")
        if (self.hidden_size // self.num_attention_heads) % 2:
            return (f"toy.model.hidden_size: {self.hidden_size} / {self.num_attention_heads} heads = "
                    f"{self.hidden_size // self.num_attention_heads} dimensions per head, odd; rotary embeddings "
                    "rotate pairs of dimensions")
        if self.num_attention_heads % self.num_key_value_heads:
            return (f"toy.model.num_attention_heads: {self.num_attention_heads} is not a multiple of "
                    f"toy.model.num_key_value_heads ({self.num_key_value_heads}): each key/value head serves a "
                    "whole group of query heads")
        return None


def corpus(alpaca_path: str | Path, pairs_path: str | Path) -> list[str]:
    """Texts of the toy corpus in the form models will see them (templated prompts, answers)."""
    from lara.read.files import read_table
    sft = read_table(alpaca_path)
    pairs = read_table(pairs_path)
    texts = [format_prompt(alpaca_user_text(i, x)) + " " + o
             for i, x, o in zip(sft["instruction"], sft["input"], sft["output"], strict=True)]
    for col in ("response_0", "response_1"):
        texts += [format_prompt(p) + " " + r for p, r in zip(pairs["prompt"], pairs[col], strict=True)]
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (any text round-trips) with Llama-style special tokens;
    it prepends ``<s>`` like the Llama tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=[SPECIAL_TOKENS[k] for k in ("pad_token", "bos_token", "eos_token", "unk_token")],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    bos = SPECIAL_TOKENS["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=2048, **SPECIAL_TOKENS)


def build_model(tokenizer, s: TinyLlamaSettings):
    """A randomly initialised (seeded) LlamaForCausalLM sized for the tokenizer."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers, num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads, max_position_embeddings=s.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(s.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    return model


def make_toy_model(alpaca_path, pairs_path, out_dir, s: TinyLlamaSettings) -> Path:
    texts = corpus(alpaca_path, pairs_path)
    log.info("training a %d-token BPE tokenizer on %d toy texts", s.vocab_size, len(texts))
    tokenizer = train_tokenizer(texts, s.vocab_size)
    model = build_model(tokenizer, s)
    n_params = sum(p.numel() for p in model.parameters())
    lengths = [len(tokenizer(t).input_ids) for t in texts[:500]]
    log.info("tiny Llama: %d parameters, vocab %d, mean tokens per text %.1f (max %d)",
             n_params, len(tokenizer), sum(lengths) / len(lengths), max(lengths))
    if max(lengths) > s.max_position_embeddings // 2:
        log.warning("toy texts reach %d tokens, over half of max_position_embeddings=%d",
                    max(lengths), s.max_position_embeddings)
    with atomic_output(out_dir, directory=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(Path(tmp) / "provenance.json",
                   record(asdict(s) | {"n_parameters": n_params},
                          inputs={"alpaca": alpaca_path, "preferences": pairs_path}, seed=s.seed))
    return Path(out_dir)


# ---------------------------------------------------------------------------------------------
# CLI: lara make-toy-model

HELP = "train the toy tokenizer and save a tiny randomly initialised Llama base model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alpaca", required=True, help="toy Alpaca-schema jsonl")
    parser.add_argument("--preferences", required=True, help="toy PKU-SafeRLHF-schema jsonl")
    parser.add_argument("--out", required=True, help="output model directory")
    add_settings_arguments(parser, TinyLlamaSettings)


def run(args) -> None:
    s = read_settings(args, TinyLlamaSettings)
    make_toy_model(args.alpaca, args.preferences, args.out, s)
