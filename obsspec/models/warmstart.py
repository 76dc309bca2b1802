"""Supervised training of the tiny models with TRL's SFTTrainer, on reference trajectories.

- Policy warm start: one example per trajectory of the train split, laid out as the policy sees
  it (obsspec/tokens.py `transcript`): prompt, then per step the bash call + <|im_end|> and the
  real observation, then `done()` + <|im_end|>. Loss on the action tokens only.
- World-model base: the same token sequence with the loss on every observation body plus its
  closing tag. A causal LM predicts each body from exactly `wm_prompt_ids(history, action)`
  (everything before it), so one sequence per trajectory trains every (context -> observation)
  pair of that trajectory at once, for the cost of one forward pass instead of one per turn.

Examples are pre-tokenized rows `{"input_ids", "completion_mask"}`; with
`completion_only_loss=True`, trl 1.16's SFTTrainer turns them into labels (-100 where the mask
is 0) before training (trl/trainer/sft_trainer.py, `_prepare_dataset`).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterable
from typing import Any

import datasets
from datasets import Dataset
from transformers import PrinterCallback, TrainerCallback
from trl import SFTConfig, SFTTrainer

from obsspec.models.config import TinyModelConfig
from obsspec.tokens import ChatFormat, transcript
from obsspec.ui.display import Display, NullDisplay


def examples(fmt: ChatFormat, trajectories: Iterable[dict], target: str,
             max_length: int) -> tuple[list[dict], int]:
    """Pre-tokenized SFT rows (`target`: "policy" or "world_model") and how many were dropped.

    A trajectory longer than `max_length` tokens is dropped rather than cut: a cut sequence would
    teach the policy half an action, or the world model half an observation.
    """
    if target not in ("policy", "world_model"):
        raise ValueError(f"target must be 'policy' or 'world_model', not {target!r}")
    rows, dropped = [], 0
    for row in trajectories:
        steps = [(s["command"], s["observation"]) for s in row["steps"]]
        t = transcript(fmt, row["instruction"], steps, done=target == "policy")
        mask = t.action_mask if target == "policy" else t.wm_mask
        if len(t.ids) > max_length:
            dropped += 1
        elif any(mask):
            rows.append({"input_ids": t.ids, "completion_mask": mask})
    return rows, dropped


class _Progress(TrainerCallback):
    """Reports training through a `Display` (one step = one optimizer step)."""

    def __init__(self, display: Display, label: str):
        self.display, self.label = display, label

    def on_train_begin(self, args, state, control, **kwargs):
        self.display.start(state.max_steps, self.label)

    def on_step_end(self, args, state, control, **kwargs):
        self.display.advance(1)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.display.log(f"{self.label}: step {state.global_step}/{state.max_steps} "
                             f"loss {logs['loss']:.3f}")

    def on_train_end(self, args, state, control, **kwargs):
        self.display.finish()


def sft_config(cfg: TinyModelConfig, out_dir: str, seed: int, **overrides: Any) -> SFTConfig:
    """CPU-friendly settings: fp32, no gradient checkpointing (tiny activations), no saving."""
    args = dict(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, activation_checkpointing=False,
        num_train_epochs=cfg.epochs, learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine", warmup_steps=0.05, weight_decay=0.0,
        per_device_train_batch_size=cfg.batch_size, per_device_eval_batch_size=cfg.batch_size,
        # Sequences are already cut to the kit's max_length; the mask marks what is learned.
        max_length=None, completion_only_loss=True,
        # Batches of similar lengths waste less compute on padding.
        train_sampling_strategy="group_by_length",
        logging_steps=0.1, report_to="none", save_strategy="no", eval_strategy="no",
        disable_tqdm=True, seed=seed, data_seed=seed, dataloader_num_workers=0,
    )
    args.update(overrides)
    return SFTConfig(**args)


def train(model: Any, tokenizer: Any, train_rows: list[dict], eval_rows: list[dict],
          cfg: TinyModelConfig, out_dir: str, seed: int = 0, label: str = "sft",
          display: Display | None = None) -> dict:
    """Train `model` in place on pre-tokenized rows; return loss figures and timings."""
    display = display or NullDisplay()
    t0 = time.monotonic()
    with _quiet():
        trainer = SFTTrainer(
            model=model, args=sft_config(cfg, out_dir, seed), processing_class=tokenizer,
            train_dataset=Dataset.from_list(train_rows),
            eval_dataset=Dataset.from_list(eval_rows) if eval_rows else None,
            callbacks=[_Progress(display, label)],
        )
    trainer.remove_callback(PrinterCallback)  # progress goes through the Display instead
    result = trainer.train() if cfg.epochs > 0 else None
    train_sec = time.monotonic() - t0
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    report = {
        "examples": len(train_rows), "eval_examples": len(eval_rows),
        "steps": trainer.state.global_step, "train_sec": round(train_sec, 1),
        "train_loss_mean": round(result.training_loss, 4) if result else None,
        # The last logging window (the last ~10% of steps): the loss the model ended with.
        "train_loss_final": round(logged[-1], 4) if logged else None,
        "tokens_trained": sum(len(r["input_ids"]) for r in train_rows) * cfg.epochs,
    }
    if eval_rows:
        eval_loss = trainer.evaluate()["eval_loss"]
        report["eval_loss"] = round(eval_loss, 4)
        report["eval_perplexity"] = round(math.exp(min(eval_loss, 50.0)), 3)
    model.eval()
    _cleanup(out_dir)
    return report


@contextlib.contextmanager
def _quiet():
    """No tqdm bars from datasets while the trainer prepares the (small) datasets."""
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def _cleanup(out_dir: str) -> None:
    # save_strategy="no" leaves at most an empty folder behind.
    try:
        os.rmdir(out_dir)
    except OSError:
        pass
