"""The kit's recipe section: sizes and training budgets of the tiny local models.

Frozen dataclasses, one `help` per field (obsspec/config.py loads them from YAML). This module
imports neither torch nor transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

from obsspec.fields import doc


@dataclass(frozen=True)
class TinyModelConfig:
    """One tiny Qwen3 model: its shape and its supervised training budget."""

    # Defaults: the policy of the embedded tiny-cpu recipe (about 3 minutes on 2 CPU cores).
    hidden_size: int = doc(128, "Width of the residual stream.")
    num_layers: int = doc(2, "Transformer blocks.")
    num_heads: int = doc(4, "Attention (query) heads.")
    num_kv_heads: int = doc(2, "Key/value heads (grouped-query attention); must divide num_heads.")
    head_dim: int = doc(32, "Width of one attention head.")
    intermediate_size: int = doc(384, "Width of the MLP's hidden layer.")
    epochs: float = doc(8.0, "Passes over the training examples (see max_steps).")
    max_steps: int = doc(300, "Cap on optimizer steps (0 = no cap; `epochs` decides): bounds the "
                              "build time on large task suites.")
    learning_rate: float = doc(5e-3, "Peak learning rate (AdamW, cosine decay, 5% warm-up).")
    batch_size: int = doc(8, "Sequences per optimizer step.")

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        if self.epochs < 0 or self.max_steps < 0 or self.learning_rate <= 0:
            raise ValueError("epochs and max_steps must be >= 0 and learning_rate > 0")


@dataclass(frozen=True)
class KitConfig:
    """What `ensure_kit` builds when the recipe names no hub models."""

    bases: str = doc("", "Pretrained tiny models (tokenizer, policy, world model) to start from "
                         "instead of building the kit: a folder written by `obsspec build-bases`, "
                         "or the name of one shipped under obsspec/bases/. Used only when they "
                         "were built for this recipe's task suite (the same train and val tasks) "
                         "and world-model snapshot setting; otherwise the kit below is built, and "
                         "the log says why. Empty = always the kit.")
    vocab_size: int = doc(4096, "Size of the byte-level BPE vocabulary trained on the task corpus "
                                 "(special tokens included).")
    digits_per_token: int = doc(1, "Longest run of digits one token may hold (1..3, cut from the "
                                   "left): 1 spells every number digit by digit; 3 lets `389` be one "
                                   "token. Changes every token id (a different kit).")
    max_length: int = doc(2048, "Longest training sequence in tokens; longer trajectories are "
                                 "dropped (and counted). Also the models' position limit.")
    seed: int = doc(0, "Seed of model initialisation and data order.")
    policy: TinyModelConfig = doc(TinyModelConfig(), "The policy (warm-started on reference "
                                   "solutions of the train split; loss on action tokens only).")
    rollouts: int = doc(0, "Sampled episodes of the warm-started policy on train tasks (real "
                           "sandboxes, the recipe's policy sampling) that the world model also "
                           "learns from; 0 = reference trajectories only.")
    world_model_tasks: int = doc(0, "More instances of the suite's built-in families, generated "
                                    "apart from the suite (other seeds; any that equals a suite task "
                                    "is dropped) and run through their reference solutions in real "
                                    "sandboxes, whose observations only the world-model base learns "
                                    "from: more listings to learn copying from. 0 = none.")
    policy_tasks: int = doc(0, "More instances of the suite's built-in families for the policy's "
                               "warm start, generated apart from the suite like world_model_tasks "
                               "(another seed; any that equals a suite task is dropped): more names "
                               "to learn copying from than the train split holds. 0 = none.")
    mistakes: int = doc(0, "Episodes per train task (and per world_model_tasks instance) of its "
                           "reference solution with one command edited (a word duplicated, dropped, "
                           "swapped, replaced or misspelt: obsspec/env/mistakes.py), run in real "
                           "sandboxes: the error messages and their consequences a sampled policy "
                           "meets. Their text is in the tokenizer's corpus and the world-model base "
                           "learns their observations. 0 = none.")
    copy_steps: int = doc(0, "Optimizer steps the world-model base first spends on copy rows alone: "
                             "per train task and world_model_tasks instance, a few commands whose "
                             "whole output is a span of the task's workspace snapshot (`ls -l DIR`, "
                             "`ls DIR`, `cat FILE`, `head -N FILE`; obsspec/worldmodel/copies.py); "
                             "its real rows then go on from that model. Needs "
                             "world_model.workspace_snapshot or world_model.hint_tokens. At the tiny-cpu world model's size it "
                             "taught only the top folder's listing in the budgets measured, unless "
                             "kit.listing_steps came first (docs/WORLDMODEL.md, \"Copying listings\"). "
                             "0 = none.")
    listing_steps: int = doc(0, "Optimizer steps the world-model base spends, before anything else, "
                                "on listing rows alone: per train task and world_model_tasks "
                                "instance, each top-level folder's `ls -l` with a snapshot holding "
                                "only that listing and no task prompt (obsspec/worldmodel/copies.py "
                                "`listing_rows`); the copy curriculum and the real rows then go on "
                                "from that model. Names it has never seen are what it learns to copy "
                                "there (docs/WORLDMODEL.md, \"Copying listings\"). Needs "
                                "world_model.workspace_snapshot or world_model.hint_tokens. 0 = none.")
    copies_per_task: int = doc(4, "Copy rows of the copy curriculum per task and generated instance, "
                                  "drawn at random from its copy steps; 0 = all of them (~9 a "
                                  "workspace: more distinct files to copy, which is what teaches "
                                  "copying rather than memory; docs/WORLDMODEL.md).")
    world_model: TinyModelConfig = doc(
        TinyModelConfig(epochs=4.0, max_steps=150),
        "The world-model base (pre-trained to write real observations; loss on body + closing tag).")

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 bytes + special tokens), got {self.vocab_size}")
        for name in ("rollouts", "world_model_tasks", "policy_tasks", "mistakes", "copy_steps", "listing_steps",
                     "copies_per_task"):
            if getattr(self, name) < 0:
                raise ValueError(f"kit.{name} must be >= 0, got {getattr(self, name)}")
        if not 1 <= self.digits_per_token <= 3:
            raise ValueError(f"kit.digits_per_token must be 1, 2 or 3, got {self.digits_per_token}")
        if self.max_length < 64:
            raise ValueError(f"max_length must be >= 64, got {self.max_length}")
