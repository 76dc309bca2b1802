"""Qwen3 stand-ins built offline: a tokenizer with Qwen3's special tokens at Qwen3's ids, and
random-initialised models of Qwen3's shapes (obsspec/memory.py `QWEN3`).

    tok = qwen3_tokenizer()                                   # or qwen3_tokenizer(corpus, chat_template=...)
    model = random_qwen3(QWEN3["Qwen/Qwen3-8B"], tok, dtype=torch.bfloat16, device="cuda")
    obsspec.models.tiny.save(model, tok, "runs/qwen3-0.6b")   # a folder `policy.model` can name

Nothing comes from a hub: the tokenizer is a small byte-level BPE trained on `corpus` with Qwen2/3's
pre-tokenizer split, its vocabulary padded with tokens no merge reaches up to 151,643, where
Qwen3's added tokens follow in Qwen3's order (its tokenizer_config.json). Every text encodes
(byte-level) and the special ids are Qwen3's, so prompts, stop tokens and masks take the ids the
real model would; the ordinary text splits into other, fewer pieces. The models have Qwen3's
vocabulary of 151,936 rows (more than the tokenizer's 151,669 ids, as in Qwen3), its layers,
heads and widths, and random weights: they exercise memory, kernels and plumbing, not behaviour.
tests/test_qwen3_layout.py checks obsspec's prompts against a Qwen3-layout template with this
tokenizer; bench/gpu_check.py runs the GPU path on these models.
"""

from __future__ import annotations

import json

from obsspec.memory import ModelShape

# Qwen3's added tokens from 151643 on, in id order (its tokenizer_config.json); True = special.
QWEN3_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
               *((f"<|{n}|>", True) for n in ("object_ref_start", "object_ref_end", "box_start", "box_end",
                                               "quad_start", "quad_end", "vision_start", "vision_end",
                                               "vision_pad", "image_pad", "video_pad")),
               ("<tool_call>", False), ("</tool_call>", False),
               *((f"<|{n}|>", False) for n in ("fim_prefix", "fim_middle", "fim_suffix", "fim_pad",
                                                "repo_name", "file_sep")),
               ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]
FIRST_ADDED = 151643
QWEN3_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
             "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666,
             "<think>": 151667, "</think>": 151668}
# Qwen2/3's pre-tokenizer split (tokenizer.json): punctuation takes the newlines after it.
QWEN3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def default_corpus() -> list[str]:
    """Texts the BPE learns its merges from: both system prompts and a few observations."""
    from obsspec.tool_prompt import system_prompt

    return [system_prompt("xml"), system_prompt("json"), "hello\n\n(exit_code=0)\n",
            "(no output)\n(exit_code=1)\n", "wc -l data/notes.txt\n3 data/notes.txt\n"] * 3


def qwen3_tokenizer(corpus: list[str] | None = None, vocab_size: int = 600, chat_template: str | None = None):
    """A transformers fast tokenizer with Qwen3's pre-tokenizer and special tokens at Qwen3's ids
    (eos `<|im_end|>`, pad `<|endoftext|>`, as Qwen3's instruct models)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.train_from_iterator(corpus or default_corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    vocab = bpe.get_vocab()
    # Pad the vocabulary with tokens no merge reaches, so the added tokens land at Qwen3's ids.
    vocab.update({f"<pad{i}>": i for i in range(len(vocab), FIRST_ADDED)})
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
              for m in json.loads(bpe.to_str())["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer, tok.decoder = bpe.pre_tokenizer, decoders.ByteLevel()
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t, special in QWEN3_ADDED])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   clean_up_tokenization_spaces=False, chat_template=chat_template)
    wrong = {t: fast.convert_tokens_to_ids(t) for t in QWEN3_IDS if fast.convert_tokens_to_ids(t) != QWEN3_IDS[t]}
    if wrong:  # (a corpus that learned more than FIRST_ADDED pieces)
        raise ValueError(f"special tokens off Qwen3's ids: {wrong}")
    return fast


def qwen3_config(shape: ModelShape, tokenizer, dtype="bfloat16"):
    """A transformers Qwen3Config of `shape` (its vocabulary rows, at least the tokenizer's ids)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=max(shape.vocab, len(tokenizer)), hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
        intermediate_size=shape.mlp, max_position_embeddings=shape.positions, tie_word_embeddings=shape.tied,
        rope_theta=1_000_000.0, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, dtype=str(dtype).removeprefix("torch."))


def random_qwen3(shape: ModelShape, tokenizer, dtype=None, device: str = "cpu", seed: int = 0):
    """A random-initialised Qwen3ForCausalLM of `shape`, built directly on `device` in `dtype`
    (an 8B shape takes 16 GB in bf16: never materialised on the CPU first)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.bfloat16
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(qwen3_config(shape, tokenizer, dtype), dtype=dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model.eval()
