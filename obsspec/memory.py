"""GPU memory arithmetic of a recipe's models: their shapes, and what each process holds.

    shape = model_shape("Qwen/Qwen3-8B")          # stored facts, a folder's config.json, or the tiny kit
    t = trainer_memory(shape, lora_rank=64, targets=ALL_LINEAR, rows=2, tokens=32768)
    t.total(checkpointing=True) / GIB             # -> ~63 GiB on one trainer GPU
    s = server_memory(shape, tp=4, share=0.9, gpu_gib=80, max_len=32768, lora_rank=64)
    s.sequences                                   # sequences of max_len its KV cache holds at once

Nothing is loaded: bytes follow from the shapes. How each figure is made:

- Weights: parameters x 2 (bf16 on GPUs). The trainer's own state: a LoRA adapter is fp32 in PEFT
  (weights, gradients, AdamW's two moments: 16 bytes a parameter, plus its bf16 copies under
  autocast); full fine-tuning keeps the bf16 weights, bf16 gradients and bf16 AdamW moments
  (8 bytes a parameter with the weights: the model is loaded in bf16 and nothing keeps an fp32
  master copy).
- Activations: bytes per token and layer that autograd keeps (`layer_bytes`). The formula was
  checked on CPU with saved-tensor hooks on real Qwen3 layers in bf16 under autocast: 222,376
  bytes for Qwen3-8B's shape with LoRA rank 64 on its seven linear modules, 215,336 with every
  weight trained, 71,960 for Qwen3-0.6B's with rank 8 (each reproduced exactly). On CUDA the
  trainer's rows are padded, so transformers builds a 4-D boolean mask (rows x tokens^2 bytes)
  and SDPA runs without grouped-query attention (keys and values repeated to the query heads) and
  with that mask made additive in bf16 inside every layer call. With activation checkpointing a
  layer keeps only its input (2 x hidden bytes a token) and one layer is recomputed at a time.
- LM head: TRL's fused head (trl/trainer/utils.py `add_fused_lm_head`,
  trl/kernels/chunked_logprob.py) projects 4,096 tokens x 32,768 vocabulary entries at a time, so
  the logits are one bf16 tile; it keeps the scored positions' hidden states and accumulates their
  gradient in fp32.
- vLLM servers: a share of each GPU (`--gpu-memory-utilization`); out of it the weights and the
  LoRA slots (2 adapters at the largest rank) split over tensor-parallel GPUs, a runtime reserve
  (CUDA context and graphs, the profiling forward of the batched tokens, the sampler's logits for
  the most sequences at once: vLLM's defaults), and the KV cache: 2 x layers x kv_heads x head_dim
  x 2 bytes a token.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

GIB = 2 ** 30
# a Qwen3 layer's linear modules (what a LoRA on "all linear" wraps)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOKEN_TILE, VOCAB_TILE = 4096, 32768    # trl 1.16's chunked log-prob tile (TOKEN_CHUNK_SIZE, chunk_size)
VLLM_MAX_LORAS = 2                      # obsspec/engines/server.py: --max-loras 2
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LOGITS_CHUNK_BYTES = 1 << 30            # obsspec/models/warmstart.py: fp32 logits the SFT loss scores at once


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    tied: bool
    positions: int
    weight_bytes: int = 2     # as loaded for training (its config's dtype; vLLM serves bf16 on GPUs)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear module of a layer."""
        h, q, kv, m = self.hidden, self.q_dim, self.kv_dim, self.mlp
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, m), "up_proj": (h, m), "down_proj": (m, h)}

    @property
    def params(self) -> int:
        per_layer = sum(i * o for i, o in self.linear_dims().values()) + 2 * self.hidden + 2 * self.head_dim
        return self.layers * per_layer + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def lora_params(self, rank: int, targets=ALL_LINEAR) -> int:
        dims = self.linear_dims()
        return self.layers * rank * sum(sum(dims[t]) for t in targets if t in dims)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


# Public configs of the models the GPU recipes name (DESIGN.md section 9), for planning offline.
QWEN3 = {
    "Qwen/Qwen3-0.6B": ModelShape("Qwen/Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, True, 40960),
    "Qwen/Qwen3-8B": ModelShape("Qwen/Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, False, 40960),
    "Qwen/Qwen3-32B": ModelShape("Qwen/Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936, False, 40960),
}


def model_shape(model: str, tiny=None, tiny_vocab: int = 0, tiny_positions: int = 0,
                tiny_folder: str = "") -> ModelShape | None:
    """The shape of `model`: its folder's config.json when there is one, the stored Qwen3 facts
    for a hub name; for the kit's 'tiny' models the bases' folder (`tiny_folder`) when there is
    one, else `tiny` (a TinyModelConfig); None when unknown."""
    if model == "tiny" and tiny_folder and os.path.isfile(os.path.join(tiny_folder, "config.json")):
        model = tiny_folder
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path) and model not in QWEN3 and model.count("/") == 1:
        path = _cached_config(model) or path
    if os.path.isfile(path):
        with open(path) as f:
            c = json.load(f)
        c = c.get("text_config", c)
        heads = c["num_attention_heads"]
        return ModelShape(model, c["num_hidden_layers"], c["hidden_size"], heads,
                          c.get("num_key_value_heads", heads), c.get("head_dim") or c["hidden_size"] // heads,
                          c["intermediate_size"], c["vocab_size"], bool(c.get("tie_word_embeddings", False)),
                          c.get("max_position_embeddings", 0),
                          4 if (c.get("dtype") or c.get("torch_dtype")) == "float32" else 2)
    if model in QWEN3:
        return QWEN3[model]
    if model == "tiny" and tiny is not None:
        return ModelShape("tiny", tiny.num_layers, tiny.hidden_size, tiny.num_heads, tiny.num_kv_heads,
                          tiny.head_dim, tiny.intermediate_size, tiny_vocab, True, tiny_positions, 4)
    return None


def _cached_config(repo: str) -> str | None:
    """A hub model's config.json when the Hugging Face cache holds it (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo, "config.json")
    return found if isinstance(found, str) else None


# ---------------------------------------------------------------------------------------------
# Activations


def layer_bytes(s: ModelShape, lora_rank: int = 0, targets=ALL_LINEAR, padded: bool = True,
                lora_input_bytes: int = 2) -> int:
    """Bytes one token keeps in one layer for the backward pass. `lora_rank` 0 = every weight
    trains; `padded`: SDPA with a padding mask (keys and values repeated to the query heads);
    `lora_input_bytes`: 2 under bf16 autocast (the trainer), 4 without it (PEFT then feeds the
    fp32 adapter fp32 copies of its inputs: the co-training worker)."""
    h, q, kv, m = s.hidden, s.q_dim, s.kv_dim, s.mlp
    out = 2 * (4 * h + 4) + (4 * q + 4 * s.heads) + (4 * kv + 4 * s.kv_heads)  # RMSNorms: fp32 input, 1/rms
    out += 2 * q + 2 * q + 4 * s.heads                                       # rotated queries, output, log-sum-exp
    out += 2 * (2 * q if padded else 2 * kv)                                 # keys, values
    out += 3 * 2 * m                                                          # gate, up, SiLU(gate)
    if lora_rank:
        dims = s.linear_dims()
        out += sum(lora_input_bytes * (dims[t][0] + lora_rank) for t in targets if t in dims)
    else:  # trained weights keep their inputs; norm weights the normalized input
        out += 2 * (2 * h) + 2 * q + 2 * kv + 2 * h + 2 * h + 2 * m
    return out


def working_bytes(s: ModelShape) -> int:
    """Gradients in flight during one layer's backward, per token."""
    return 2 * (2 * s.hidden) + 2 * (2 * s.mlp)


@dataclass(frozen=True)
class TrainerMemory:
    """One trainer process's GPU, bytes."""

    weights: int
    train_state: int        # adapter or full-weight gradients and optimizer moments
    activations_on: int     # activation checkpointing on
    activations_off: int
    mask_on: int            # the rows' attention mask (boolean, and one layer's additive copy)
    mask_off: int           # (every layer's additive copy kept)
    lm_head: int            # the fused head's tile, scored hidden states and their fp32 gradient
    tile: int
    kv_cache: int = 0       # an in-process hf engine's KV cache (rollouts alternate with training)

    def total(self, checkpointing: bool) -> int:
        act = (self.activations_on + self.mask_on if checkpointing else self.activations_off + self.mask_off)
        return self.weights + self.train_state + max(act + self.lm_head, self.kv_cache)


def trainer_memory(s: ModelShape, lora_rank: int, targets=ALL_LINEAR, rows: int = 1, tokens: int = 2048,
                   kv_sequences: int = 0) -> TrainerMemory:
    """The policy trainer's GPU at `rows` x `tokens` a micro-batch (bf16 under autocast)."""
    n = rows * tokens
    if lora_rank:
        adapter = s.lora_params(lora_rank, targets)
        state = adapter * (4 + 4 + 8 + 2)   # fp32 weights, gradients, AdamW moments; bf16 copies
    else:
        state = s.params * 3 * s.weight_bytes   # gradients and AdamW moments in the weights' dtype
    per_layer = layer_bytes(s, lora_rank, targets)
    on = n * (s.layers * 2 * s.hidden + per_layer + working_bytes(s))
    off = n * (s.layers * per_layer + working_bytes(s))
    square = rows * tokens * tokens
    tile = min(n, TOKEN_TILE) * VOCAB_TILE * 2
    head = n * (4 * s.hidden + 4 + 2 * s.hidden + 4 * s.hidden + 8 * 4) + tile
    if not lora_rank:
        head += s.vocab * s.hidden * 4      # the head weight's fp32 gradient
    return TrainerMemory(s.params * s.weight_bytes, state, on, off, square * 3, square * (1 + 2 * s.layers), head, tile,
                         kv_sequences * tokens * s.kv_bytes_per_token)


@dataclass(frozen=True)
class CotrainMemory:
    """The world model's co-training worker (obsspec/training/cotrain.py): bf16 base, fp32
    LoRA, no autocast (models/warmstart.py `sft_config`); `micro` rows of `max_length` tokens a
    pass (wm_train.micro_batch_size), activation checkpointing as wm_train says; padded rows
    (micro > 1) make a 4-D mask in every layer and SDPA repeat the keys and values, one row pads
    nothing; the loss scores the labelled positions only, `LOGITS_CHUNK_BYTES` of fp32 logits at a
    time (`masked_nll`), each logit with its log-softmax and both gradients."""

    weights: int
    train_state: int
    activations: int
    mask: int
    logits: int

    def total(self) -> int:
        return self.weights + self.train_state + self.activations + self.mask + self.logits


def cotrain_memory(s: ModelShape, rank: int, targets, micro: int, max_length: int,
                   checkpointing: bool = False) -> CotrainMemory:
    n = micro * max_length
    per_layer = layer_bytes(s, rank, targets, padded=micro > 1, lora_input_bytes=4)
    kept = s.layers * 2 * s.hidden + per_layer if checkpointing else s.layers * per_layer
    chunk = min(n, max(1, LOGITS_CHUNK_BYTES // (4 * s.vocab)))
    return CotrainMemory(s.params * s.weight_bytes, s.lora_params(rank, targets) * 16,
                         n * (kept + working_bytes(s)),
                         micro * max_length * max_length * (1 + 2 * s.layers) if micro > 1 else 0,
                         chunk * s.vocab * 16)


# ---------------------------------------------------------------------------------------------
# vLLM servers


@dataclass(frozen=True)
class ServerMemory:
    """One vLLM server; every figure per GPU but `kv_total` and `sequences`."""

    budget: int
    weights: int
    lora: int
    reserve: int
    kv: int
    kv_total: int
    max_len: int
    sequences: int           # sequences of max_len the whole KV cache holds at once


def vllm_defaults(gpu_gib: float) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of vLLM's API server (vllm/engine/arg_utils.py):
    larger on cards of 70 GiB and more."""
    return (8192, 1024) if gpu_gib >= 70 else (2048, 256)


def server_memory(s: ModelShape, tp: int, share: float, gpu_gib: float, max_len: int,
                  lora_rank: int) -> ServerMemory:
    budget = int(share * gpu_gib * GIB)
    weights = s.params * 2 // tp
    rank = next((r for r in VLLM_LORA_RANKS if r >= lora_rank), lora_rank) if lora_rank else 0
    lora = VLLM_MAX_LORAS * s.lora_params(rank) * 2 // tp
    batched, seqs = vllm_defaults(gpu_gib)
    act = batched * (3 * 2 * s.hidden + 2 * (s.q_dim + 2 * s.kv_dim) // tp + 2 * 2 * s.mlp // tp)
    reserve = GIB + act + seqs * s.vocab * 4 * 2
    kv = budget - weights - lora - reserve
    kv_total = max(kv, 0) * tp
    per_seq = max_len * s.kv_bytes_per_token
    return ServerMemory(budget, weights, lora, reserve, kv, kv_total, max_len, kv_total // per_seq)
