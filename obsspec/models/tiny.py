"""Tiny Qwen3 models built from config, and the one loader for local folders and hub names.

    model = build_model(KitConfig().policy, tokenizer, max_positions=2048, seed=0)
    model.save_pretrained("kit/policy"); tokenizer.save_pretrained("kit/policy")
    model, tokenizer = load_pretrained("kit/policy")      # or load_pretrained("Qwen/Qwen3-8B")
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from obsspec.models.config import TinyModelConfig


def model_config(cfg: TinyModelConfig, tokenizer: Any, max_positions: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_model(cfg: TinyModelConfig, tokenizer: Any, max_positions: int, seed: int = 0) -> Qwen3ForCausalLM:
    """A randomly initialised tiny Qwen3 (the same seed gives the same weights)."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(model_config(cfg, tokenizer, max_positions))
    # Generation stops on <|im_end|> and pads with <|endoftext|>, like Qwen3's own config.
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def no_progress_bars():
    """No "Writing model shards" / "Loading weights" bars for a few MB (they garble displays)."""
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def save(model: Any, tokenizer: Any, path: str | os.PathLike[str]) -> None:
    """An ordinary model folder: weights, config and the tokenizer, loadable by `load_pretrained`."""
    with no_progress_bars():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)


def load_pretrained(name_or_path: str | os.PathLike[str], *, dtype: Any = "auto", device: str = "cpu"):
    """(model, tokenizer) from a local folder or a hub name: the same call serves both."""
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype)
    return model.to(device).eval(), tokenizer
