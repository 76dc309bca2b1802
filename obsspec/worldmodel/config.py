"""The `wm_train` recipe section: LoRA settings, training budget and data of `train-worldmodel`.

Frozen dataclass, one `help` per field (obsspec/config.py loads it from YAML and rejects unknown
keys). This module imports neither torch nor transformers, so `obsspec validate` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from obsspec.fields import doc

# Every linear layer of a Qwen3 block: on the tiny models attention-only LoRA learns too little
# (measured in docs/WORLDMODEL.md); vLLM serves LoRA on all seven.
class WorldModelError(ValueError):
    """A problem with the user's inputs to world-model training or evaluation: a missing or
    unrecognised data source, a broken adapter folder, an unknown version (one line, exit 2)."""


ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class WorldModelTrainConfig:
    """How `obsspec train-worldmodel` (and co-training in `obsspec train`) fine-tunes the world
    model: a LoRA adapter on the recipe's `world_model.model`, loss on observation tokens only."""

    rank: int = doc(8, "LoRA rank r.")
    alpha: int = doc(16, "LoRA alpha (the update is scaled by alpha / rank).")
    target_modules: tuple[str, ...] = doc(ALL_LINEAR, "Module names LoRA wraps (default: every "
                                                      "linear layer of a Qwen3 block).")
    learning_rate: float = doc(2e-3, "Peak learning rate (AdamW, cosine decay, 5% warm-up); LoRA "
                                     "on the tiny models wants about 1e-3..5e-3, a 0.6B model ~1e-4.")
    epochs: float = doc(4.0, "Passes over the training examples (see max_steps).")
    max_steps: int = doc(300, "Cap on optimizer steps (0 = no cap; `epochs` decides).")
    batch_size: int = doc(8, "Sequences per optimizer step.")
    micro_batch_size: int = doc(0, "Sequences per forward/backward pass, accumulated to batch_size "
                                   "(0 = batch_size, one pass a step). 1 pads nothing: padded rows "
                                   "make an attention mask of rows x length^2 bytes in every layer.")
    max_length: int = doc(2048, "Longest row in tokens. A longer episode is cut into windows that end "
                                "at an observation and keep it whole, with at least half this budget "
                                "of the latest context before it (the workspace snapshot ahead of "
                                "each); an observation longer than the budget alone is dropped and "
                                "counted (obsspec/windows.py).")
    activation_checkpointing: bool = doc(False, "Keep only each layer's input in the forward pass and "
                                                "recompute the rest in the backward: without it a "
                                                "Qwen3-0.6B row keeps ~2.5 MB of activations a token "
                                                "(32k tokens: ~80 GiB; with it ~5). For long rows on GPUs.")
    eval_fraction: float = doc(0.2, "Share of task instances held out (split by task instance, so "
                                    "no held-out step comes from an episode trained on).")
    eval_max_tokens: int = doc(0, "Draft cap in evaluation (0 = world_model.max_tokens); a draft "
                                  "that needs more counts as unusable.")
    init_adapter: str = doc("", "Continue training this adapter (a folder, a run directory = its "
                                "latest version, or DIR@N); '' = a fresh adapter.")
    seed: int = doc(0, "Seed of the split, LoRA initialisation and data order.")

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha < 1:
            raise ValueError(f"wm_train.rank and wm_train.alpha must be >= 1 (got {self.rank}, {self.alpha})")
        if not self.target_modules:
            raise ValueError("wm_train.target_modules is empty: name at least one module, e.g. [q_proj, v_proj]")
        if self.learning_rate <= 0 or self.epochs <= 0 or self.max_steps < 0:
            raise ValueError("wm_train.learning_rate and wm_train.epochs must be > 0 and "
                             "wm_train.max_steps >= 0 (0 = no cap)")
        if self.batch_size < 1 or self.max_length < 64:
            raise ValueError("wm_train.batch_size must be >= 1 and wm_train.max_length >= 64")
        if self.micro_batch_size < 0 or self.batch_size % (self.micro_batch_size or self.batch_size):
            raise ValueError(f"wm_train.micro_batch_size ({self.micro_batch_size}) must divide "
                             f"wm_train.batch_size ({self.batch_size}) (0 = batch_size)")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"wm_train.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.eval_max_tokens < 0:
            raise ValueError("wm_train.eval_max_tokens must be >= 0")


# No LoRA dropout: the adapters train a few hundred steps on fresh rollouts, where dropout's noise
# only slows them; no recipe has ever set another value.
LORA_DROPOUT = 0.0


def peft_lora(rank: int, alpha: int, target_modules):
    """The PEFT LoraConfig obsspec trains (the world model's adapters and a policy LoRA alike)."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=LORA_DROPOUT,
                      target_modules=list(target_modules), bias="none", task_type="CAUSAL_LM")
